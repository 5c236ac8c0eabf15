//! `vallumd --nfqueue-facts-mark FIELD`: the steering's facts chains, which hand the packet path
//! what only the kernel knows ([`vallum_engine::kernel_decided`]: `-m policy`, `--ctstatus`,
//! `--ctstate DNAT/SNAT`, the original and reply tuples of the kernel's conntrack entry).
//!
//! What the kernel gets. Per family, in the filter table, one chain per steered hook,
//! `VALLUM-FACTS-INPUT`, `-FORWARD`, `-OUTPUT`: a rule that clears FIELD, then one rule per
//! kernel-decided expression of the active rulesets that the kernel takes at that hook, which
//! sets the expression's bit:
//!
//! ```text
//! -A VALLUM-FACTS-INPUT -j MARK --set-xmark 0x0/0xff0000
//! -A VALLUM-FACTS-INPUT -m conntrack --ctstate DNAT -j MARK --set-xmark 0x10000/0x10000
//! -A VALLUM-FACTS-INPUT -m policy --dir in --pol none -j MARK --set-xmark 0x20000/0x20000
//! ```
//!
//! `vallumctl dataplane install --facts-mark FIELD` creates the chains and puts a jump to each
//! at the top of its builtin chain, before the jump to the NFQUEUE steering; vallumd replaces
//! their rules with `iptables-restore --noflush` (which flushes a chain it declares and leaves
//! every other chain alone), with the program of `--kernel-tables-restore` (default
//! `iptables-nft-restore` when on PATH, else `iptables-legacy-restore`: the backend the
//! steering was installed with). The packet path reads FIELD from the queued packet's mark
//! (`--nfqueue-facts-mark` in [`crate::config::NfqueueAnswers`]).
//!
//! When. With each commit whose assignment of bits changes, after the store and the kernel
//! tables and before the engine publishes (a commit the kernel refuses here fails and is
//! reverted), and once at start. A family with expressions must have the jumps: when a steered
//! hook's builtin chain does not jump to its facts chain (the steering was installed without
//! `--facts-mark`, or with another backend), the commit fails, naming the command that installs
//! it, instead of running rules that would never match.

use std::sync::Arc;

use vallum_engine::kernel_decided::FactBits;
use vallum_engine::model::{Family, Hook};

use super::kernel_tables::{Tools, on_path, run, tools_of};
use crate::error::{Error, Result};

/// The facts chain of steered hook `hook` (`VALLUM-FACTS-INPUT`); `vallumctl dataplane
/// install --facts-mark` writes the same names.
pub fn chain_name(hook: Hook) -> String {
    format!("VALLUM-FACTS-{}", hook.chain_name())
}

/// The facts chains of one vallumd.
#[derive(Debug)]
pub struct FactsChains {
    field: u32,
    hooks: Vec<Hook>,
    tools: [Tools; 2],
    /// The text last written per family (`None`: not yet).
    applied: tokio::sync::Mutex<[Option<String>; 2]>,
}

impl FactsChains {
    /// The facts chains of `field` (`--nfqueue-facts-mark`) for the `steered` hooks, written
    /// with `restore` (`--kernel-tables-restore`; default as the module docs say); `None`
    /// when `field` is 0.
    ///
    /// Errors: [`Error::Startup`] when no restore program is found or its name does not say
    /// which save program goes with it.
    pub fn new(
        field: u32,
        steered: &[Hook],
        restore: Option<&std::path::Path>,
    ) -> Result<Option<FactsChains>> {
        if field == 0 {
            return Ok(None);
        }
        let startup = |message: String| Error::Startup {
            code: crate::error::Reason::KernelTablesRefused.info().name,
            message,
        };
        let restore = match restore {
            Some(p) => p.to_path_buf(),
            None => ["iptables-nft-restore", "iptables-legacy-restore"]
                .into_iter()
                .map(std::path::PathBuf::from)
                .find(|p| on_path(p).is_some())
                .ok_or_else(|| {
                    startup(
                        "--nfqueue-facts-mark: neither iptables-nft-restore nor \
                         iptables-legacy-restore is on PATH (or give --kernel-tables-restore)"
                            .into(),
                    )
                })?,
        };
        Ok(Some(FactsChains {
            field,
            hooks: steered.to_vec(),
            tools: [
                tools_of(&restore, Family::Ipv4).map_err(startup)?,
                tools_of(&restore, Family::Ipv6).map_err(startup)?,
            ],
            applied: tokio::sync::Mutex::new([None, None]),
        }))
    }

    /// The `iptables-restore --noflush` text of `family`'s facts chains for `facts`.
    pub fn text(&self, facts: &FactBits, family: Family) -> String {
        let shift = self.field.trailing_zeros();
        let mut out = String::from("*filter\n");
        for h in &self.hooks {
            out.push_str(&format!(":{} - [0:0]\n", chain_name(*h)));
        }
        for h in &self.hooks {
            let chain = chain_name(*h);
            out.push_str(&format!(
                "-A {chain} -j MARK --set-xmark 0x0/{:#x}\n",
                self.field
            ));
            for (bit, e) in facts.exprs() {
                if e.family == family && e.valid_at(*h) {
                    let v = 1u32 << (u32::from(bit) + shift);
                    out.push_str(&format!(
                        "-A {chain} {} -j MARK --set-xmark {v:#x}/{v:#x}\n",
                        e.text
                    ));
                }
            }
        }
        out.push_str("COMMIT\n");
        out
    }

    /// Writes the chains of `facts` where they changed, and checks that each family with
    /// expressions has the steering's jumps (see the module docs).
    ///
    /// Errors: [`Error::KernelTables`] when the kernel refuses the text, or a jump is missing
    /// (nothing is remembered as written then: the next call writes again).
    pub async fn apply(&self, facts: &Arc<FactBits>) -> Result<()> {
        let mut applied = self.applied.lock().await;
        for (i, family) in [Family::Ipv4, Family::Ipv6].into_iter().enumerate() {
            let text = self.text(facts, family);
            if applied[i].as_deref() == Some(text.as_str()) {
                continue;
            }
            applied[i] = None;
            let tools = &self.tools[i];
            let out = run(&tools.restore, &["--noflush"], Some(&text)).await?;
            if !out.status_ok {
                return Err(Error::KernelTables(format!(
                    "{} refused the facts chains ({}):\n{text}",
                    tools.restore.display(),
                    out.stderr
                )));
            }
            if facts.exprs().any(|(_, e)| e.family == family) {
                let save = run(&tools.save, &["-t", "filter"], None).await?;
                for h in &self.hooks {
                    let jump = format!("-A {} -j {}", h.chain_name(), chain_name(*h));
                    if !save.stdout.lines().any(|l| l == jump) {
                        return Err(Error::KernelTables(format!(
                            "the steering ({}) has no `{jump}`: the kernel-decided matches \
                             would never match; install it with `vallumctl dataplane install \
                             --facts-mark {:#x}` (the same backend)",
                            tools.save.display(),
                            self.field
                        )));
                    }
                }
            }
            applied[i] = Some(text);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use vallum_engine::restore::{ParseOptions, parse_ruleset};

    use super::*;

    #[test]
    fn text_sets_each_expression_where_the_kernel_takes_it() {
        let rs = parse_ruleset(
            "a",
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
             -A INPUT -m conntrack --ctstate DNAT -j ACCEPT\n\
             -A INPUT -m policy --dir in --pol none -j ACCEPT\n\
             -A OUTPUT -m policy --dir out --pol ipsec -j ACCEPT\nCOMMIT\n",
            &ParseOptions::default(),
        )
        .unwrap();
        let facts = FactBits::assign(&FactBits::default(), 8, [&rs]).unwrap();
        let f = FactsChains {
            field: 0x00ff_0000,
            hooks: vec![Hook::Input, Hook::Output],
            tools: [
                tools_of(
                    std::path::Path::new("iptables-legacy-restore"),
                    Family::Ipv4,
                )
                .unwrap(),
                tools_of(
                    std::path::Path::new("iptables-legacy-restore"),
                    Family::Ipv6,
                )
                .unwrap(),
            ],
            applied: tokio::sync::Mutex::new([None, None]),
        };
        assert_eq!(
            f.text(&facts, Family::Ipv4),
            "*filter\n:VALLUM-FACTS-INPUT - [0:0]\n:VALLUM-FACTS-OUTPUT - [0:0]\n\
             -A VALLUM-FACTS-INPUT -j MARK --set-xmark 0x0/0xff0000\n\
             -A VALLUM-FACTS-INPUT -m conntrack --ctstate DNAT -j MARK --set-xmark 0x10000/0x10000\n\
             -A VALLUM-FACTS-INPUT -m policy --dir in --pol none -j MARK --set-xmark 0x20000/0x20000\n\
             -A VALLUM-FACTS-OUTPUT -j MARK --set-xmark 0x0/0xff0000\n\
             -A VALLUM-FACTS-OUTPUT -m conntrack --ctstate DNAT -j MARK --set-xmark 0x10000/0x10000\n\
             -A VALLUM-FACTS-OUTPUT -m policy --dir out --pol ipsec -j MARK --set-xmark 0x40000/0x40000\n\
             COMMIT\n"
        );
        // IPv6 has none: only the clearing rules.
        assert!(!f.text(&facts, Family::Ipv6).contains("conntrack"));
    }
}
