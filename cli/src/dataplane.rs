//! `vallumctl dataplane install|uninstall`: the steering rules that hand the current network
//! namespace's packets to vallumd's NFQUEUE workers, put in and taken out with the system's
//! own iptables (no gRPC).
//!
//! Layout (both families unless `--family`): a chain `VALLUM-NFQUEUE` in the filter table
//!
//! ```text
//! -A VALLUM-NFQUEUE -m mark ! --mark 0x0/R -j VALLUM-REJECT     (R = --reject-mark, unless 0)
//! -A VALLUM-NFQUEUE -m mark --mark B/B -j RETURN              (--mode continue, B = --mark)
//! -A VALLUM-NFQUEUE -i lo -j RETURN                          (unless --include-loopback)
//! -A VALLUM-NFQUEUE -o lo -j RETURN
//! -A VALLUM-NFQUEUE -p tcp -m multiport --dports 22,50051,9464 -j RETURN   (--exempt-tcp-ports)
//! -A VALLUM-NFQUEUE -p tcp -m multiport --sports 22,50051,9464 -j RETURN
//! -A VALLUM-NFQUEUE -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT  (--new-only)
//! -A VALLUM-NFQUEUE -j NFQUEUE --queue-balance F:F+N-1 --queue-bypass  (--fail-closed: no bypass)
//! ```
//!
//! (`--queue-cpu-fanout` appends that flag: the queue is the one of the CPU that handles the
//! packet instead of a hash of its addresses.)
//!
//! and one `-j VALLUM-NFQUEUE` at the top of each chosen builtin chain (INPUT, OUTPUT, FORWARD
//! by default).
//!
//! Kernel-decided matches (`--facts-mark F`, vallumd's `--nfqueue-facts-mark`): one chain
//! `VALLUM-FACTS-<CHAIN>` per chosen chain, jumped to at the very top of it (before the jump
//! above), which vallumd fills with one `-j MARK` rule per expression it needs the kernel to
//! decide (`-m policy`, `--ctstatus`, `--ctstate DNAT`, `--ctorig*`); an install keeps the rules
//! of a facts chain that exists.
//!
//! REJECT: vallumd answers a packet its rules REJECT with `NF_REPEAT` and the answer's code
//! (`RejectWith::code`, 1 to 10) in the 4-bit mark field R (`--reject-mark`, vallumd's
//! `--nfqueue-reject-mark`, default 0x0f000000). The kernel runs the chain again; the first rule
//! above sends the packet to `VALLUM-REJECT`, which holds one rule per answer the family's
//! REJECT has (`-m mark --mark CODE/R -j VALLUM-REJECT-NAME`, with `-p tcp` for tcp-reset), and
//! each `VALLUM-REJECT-NAME` chain clears R (`-j MARK --set-xmark 0x0/R`, so the answer's mark
//! is what vallumd's rules left) and ends in the kernel's `-j REJECT --reject-with TYPE`. So the
//! answer is the kernel's own: the ICMP type and code, the RST's sequence numbers, no answer
//! to an ICMP error or a RST, the ICMP rate limit. `--reject-mark 0` writes none of this
//! (vallumd's REJECT then drops silently).
//!
//! `--mode` says what vallumd's ACCEPT does with the kernel's own rules after the jump (ufw's
//! chains, DOCKER-USER, kube-proxy's): `final` (the default) lets vallumd answer NF_ACCEPT,
//! which skips them; `continue` pairs with `vallumd --nfqueue-mode continue`, whose ACCEPT is
//! NF_REPEAT with bit B set in the packet's mark: the kernel runs the chain again from the
//! top, the first rule above RETURNs for the marked packet, and the kernel's remaining rules
//! decide. A packet that already carries B when it first reaches the jump is not steered.
//!
//! Install is declarative and idempotent: it writes the chain's whole content
//! and replaces every jump to it, in one `iptables-restore --noflush` transaction, so
//! installing twice leaves what installing once does and a second install with other flags
//! replaces the first. Uninstall deletes the jumps and the chain; when there is none it
//! succeeds and says so.
//!
//! The bypass choice per chain (`--fail-closed INPUT`): `--queue-bypass` is an option of the
//! NFQUEUE rule, so when some steered chains are fail-closed and others not, the fail-closed
//! ones jump to a second chain `VALLUM-NFQUEUE-CLOSED`, the same rules without
//! `--queue-bypass`. It decides what happens while no vallumd worker is bound to the queue
//! (not started, restarting): accepted (bypass) or dropped. What happens when vallumd is bound
//! but too slow (the queue or its socket is full) is vallumd's choice per queue, its `--source
//! nfqueue,fail-closed` (docs/operations.md, "Overload").
//!
//! `--new-only` queues only packets the kernel's conntrack does not see as ESTABLISHED or
//! RELATED: those are accepted in the kernel (the rest of the filter table's chain is not
//! run for them, as for any ACCEPT), so vallumd classifies NEW, INVALID and UNTRACKED packets
//! only. Tell vallumd with `--steered-new-only` (rules that match only established traffic
//! get a warning); what changes for counters, sets and rules: docs/operations.md, "Queueing
//! only new connections".

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use vallum_engine::mark_field::{parse_facts_mark, parse_reject_mark};
use vallum_engine::model::{Family, RejectWith};

use crate::error::CliError;

/// The steering chain in the filter table.
pub const CHAIN: &str = "VALLUM-NFQUEUE";
/// The steering chain of the fail-closed chains when only some are (`--fail-closed INPUT`).
pub const CHAIN_CLOSED: &str = "VALLUM-NFQUEUE-CLOSED";
/// The facts chains' prefix (`VALLUM-FACTS-INPUT`, ...): vallumd's `--nfqueue-facts-mark`
/// writes the kernel's decisions there.
pub const FACTS_CHAIN: &str = "VALLUM-FACTS";
/// The chain the steering sends a packet carrying a reject code to.
pub const REJECT_CHAIN: &str = "VALLUM-REJECT";
/// The default `--reject-mark` (vallumd's `--nfqueue-reject-mark` default): bits 24 to 27.
pub const DEFAULT_REJECT_MARK: &str = "0x0f000000";
/// The chain of each answer (`VALLUM-REJECT-` and this), in `RejectWith::ALL` order.
const REJECT_SUFFIX: [&str; 10] = [
    "NET-UNREACH",
    "HOST-UNREACH",
    "PORT-UNREACH",
    "PROTO-UNREACH",
    "NET-PROHIB",
    "HOST-PROHIB",
    "ADMIN-PROHIB",
    "TCP-RESET",
    "POLICY-FAIL",
    "REJECT-ROUTE",
];
/// The builtin chains of the filter table a jump can come from.
const BUILTIN: [&str; 3] = ["INPUT", "FORWARD", "OUTPUT"];

/// Address family, as iptables / ip6tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FamilyChoice {
    /// iptables only.
    Ipv4,
    /// ip6tables only.
    Ipv6,
    /// Both.
    Both,
}

/// Flags shared by install and uninstall.
#[derive(Debug, clap::Args)]
pub struct ToolArgs {
    /// The iptables program (e.g. iptables-legacy or a full path); the IPv6 one is the same
    /// name with ip6tables, the restore one the name plus `-restore`.
    #[arg(long, value_name = "PATH", default_value = "iptables")]
    iptables: PathBuf,
    /// Families to steer.
    #[arg(long, value_enum, default_value_t = FamilyChoice::Both)]
    family: FamilyChoice,
    /// Print the iptables-restore input instead of running it.
    #[arg(long)]
    dry_run: bool,
}

/// What vallumd's ACCEPT means for the kernel's rules after the steering jump.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// vallumd's ACCEPT is the host's ACCEPT (NF_ACCEPT): the kernel's rules after the jump
    /// (ufw, DOCKER-USER, kube-proxy) are skipped for packets vallumd accepts.
    Final,
    /// vallumd's ACCEPT (with `--nfqueue-mode continue`) hands the packet back with `--mark`
    /// set; the steering chain RETURNs for it, so the kernel's remaining rules still decide.
    Continue,
}

/// The default `--mark` (vallumd's `--nfqueue-mark` default): bit 30, outside the bits
/// kube-proxy, Docker, ufw, Cilium, Istio and wg-quick use (docs/operations.md).
pub const DEFAULT_MARK: &str = "0x40000000";

/// A mark bit: hex (`0x40000000`) or decimal, exactly one bit set.
fn parse_mark_bit(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse::<u32>(),
    }
    .map_err(|_| format!("{s:?} is not a 32-bit mark (e.g. {DEFAULT_MARK})"))?;
    if v.count_ones() != 1 {
        return Err(format!(
            "{s:?}: a mark bit has exactly one bit set (e.g. {DEFAULT_MARK})"
        ));
    }
    Ok(v)
}

/// The facts chain of builtin chain `c` (vallumd's `facts_chains::chain_name`).
fn facts_chain(c: &str) -> String {
    format!("{FACTS_CHAIN}-{c}")
}

/// `dataplane install` flags.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// What vallumd's ACCEPT does with the kernel's own rules after the steering jump (ufw,
    /// DOCKER-USER, kube-proxy): `final` skips them, `continue` lets them decide too (run
    /// vallumd with `--nfqueue-mode continue` and the same `--nfqueue-mark`).
    #[arg(long, value_enum, default_value_t = Mode::Final)]
    mode: Mode,
    /// With `--mode continue`: the mark bit vallumd sets on packets it accepts, which the
    /// steering chain skips (hex or decimal, one bit; vallumd's `--nfqueue-mark`).
    #[arg(long, default_value = DEFAULT_MARK, value_parser = parse_mark_bit)]
    mark: u32,
    /// The mark field (4 contiguous bits; vallumd's `--nfqueue-reject-mark`) that carries
    /// vallumd's REJECT to the kernel's REJECT rules this installs; 0 installs none (vallumd's
    /// REJECT then drops silently). Reserve these bits: a packet reaching the steering with a
    /// reject code in them is rejected by the kernel.
    #[arg(long, env = "VALLUM_NFQUEUE_REJECT_MARK", default_value = DEFAULT_REJECT_MARK, value_parser = parse_reject_mark)]
    reject_mark: u32,
    /// The mark field (contiguous bits; vallumd's `--nfqueue-facts-mark`) in which the kernel
    /// hands vallumd the matches it decides (`-m policy`, `--ctstatus`, `--ctstate DNAT`,
    /// `--ctorig*`): creates a `VALLUM-FACTS-<CHAIN>` chain per steered chain, jumped to before
    /// the steering, which vallumd fills. 0 (the default): none. Reserve these bits.
    #[arg(long, env = "VALLUM_NFQUEUE_FACTS_MARK", default_value = "0", value_parser = parse_facts_mark)]
    facts_mark: u32,
    /// Number of queues (= vallumd's --cores), starting at --queue-first.
    #[arg(long, visible_alias = "queue-count", default_value_t = default_queues(), value_parser = clap::value_parser!(u16).range(1..))]
    queues: u16,
    /// First queue number (= FIRST of vallumd's --source nfqueue:FIRST).
    #[arg(long, default_value_t = 0)]
    queue_first: u16,
    /// Omit --queue-bypass: while no vallumd worker is bound to a queue its packets are
    /// dropped instead of accepted. Alone: every steered chain; with chains
    /// (`--fail-closed INPUT,FORWARD`): those only, the others keep the bypass.
    #[arg(long, value_name = "CHAINS", num_args = 0..=1, value_delimiter = ',')]
    fail_closed: Option<Vec<String>>,
    /// Queue only packets the kernel's conntrack does not see as ESTABLISHED or RELATED;
    /// those are accepted in the kernel (`-m conntrack --ctstate RELATED,ESTABLISHED -j
    /// ACCEPT` before the NFQUEUE rule). Start vallumd with `--steered-new-only`.
    #[arg(long)]
    new_only: bool,
    /// Choose the queue by the CPU that handles the packet (queue F + cpu % N, xt_NFQUEUE's
    /// `--queue-cpu-fanout`) instead of by a hash of its addresses: with one worker per
    /// queue, the packets a CPU's receive queue brings stay on that CPU's worker (pair it
    /// with RSS/RPS and IRQ affinity). Needs --queues 2 or more.
    #[arg(long)]
    queue_cpu_fanout: bool,
    /// Builtin filter chains that jump to the steering chain.
    #[arg(long, value_delimiter = ',', default_value = "INPUT,OUTPUT,FORWARD")]
    chains: Vec<String>,
    /// Steer loopback traffic too (by default `lo` is exempt).
    #[arg(long)]
    include_loopback: bool,
    /// TCP ports (either direction) never steered, comma-separated; empty for none. The
    /// default ([`DEFAULT_EXEMPT_TCP_PORTS`]) keeps SSH and vallumd's gRPC and metrics ports
    /// reachable whatever the ruleset says, so a ruleset that forgets them cannot lock the
    /// operator out.
    #[arg(long, default_value = DEFAULT_EXEMPT_TCP_PORTS)]
    exempt_tcp_ports: String,
    #[command(flatten)]
    tool: ToolArgs,
}

/// The TCP ports `dataplane install` never steers unless told otherwise: SSH (22) and
/// vallumd's default gRPC (50051) and metrics (9464) ports.
pub const DEFAULT_EXEMPT_TCP_PORTS: &str = "22,50051,9464";

fn default_queues() -> u16 {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(usize::from(u16::MAX)) as u16
}

/// The `dataplane` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum DataplaneCommand {
    /// Put the NFQUEUE steering rules into the current network namespace (idempotent).
    Install(InstallArgs),
    /// Take them out (succeeds when there are none).
    Uninstall(ToolArgs),
}

/// What install writes, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Plan {
    /// `--mode continue`: the mark bit the chain RETURNs for.
    skip_mark: Option<u32>,
    /// The reject mark field (`--reject-mark`; 0: no reject rules).
    reject_mark: u32,
    /// The facts mark field (`--facts-mark`; 0: no facts chains).
    facts_mark: u32,
    first: u16,
    count: u16,
    /// The chosen chains that are fail-closed (no `--queue-bypass`).
    closed: Vec<&'static str>,
    new_only: bool,
    cpu_fanout: bool,
    chains: Vec<&'static str>,
    loopback: bool,
    exempt: Vec<u16>,
}

impl Plan {
    fn from_args(a: &InstallArgs) -> Result<Plan, CliError> {
        let last = u32::from(a.queue_first) + u32::from(a.queues) - 1;
        if last > u32::from(u16::MAX) {
            return Err(CliError::Argument(format!(
                "--queue-first {} --queues {}: queue numbers end at 65535",
                a.queue_first, a.queues
            )));
        }
        if a.queue_cpu_fanout && a.queues < 2 {
            return Err(CliError::Argument(
                "--queue-cpu-fanout: needs --queues 2 or more (it spreads over a --queue-balance range)"
                    .into(),
            ));
        }
        if a.mode == Mode::Continue && a.mark & a.reject_mark != 0 {
            return Err(CliError::Argument(format!(
                "--mark {:#x} lies inside --reject-mark {:#x}: pick bits that do not overlap",
                a.mark, a.reject_mark
            )));
        }
        let continue_bit = if a.mode == Mode::Continue { a.mark } else { 0 };
        if a.facts_mark & (a.reject_mark | continue_bit) != 0 {
            return Err(CliError::Argument(format!(
                "--facts-mark {:#x} overlaps --reject-mark {:#x} or --mark {continue_bit:#x}: \
                 pick bits that do not overlap",
                a.facts_mark, a.reject_mark
            )));
        }
        let chains = builtin_chains("--chains", &a.chains)?;
        if chains.is_empty() {
            return Err(CliError::Argument(
                "--chains: name at least one chain".into(),
            ));
        }
        let closed = match &a.fail_closed {
            None => Vec::new(),
            Some(list) if list.iter().all(|c| c.trim().is_empty()) => chains.clone(),
            Some(list) => {
                let closed = builtin_chains("--fail-closed", list)?;
                if let Some(c) = closed.iter().find(|c| !chains.contains(c)) {
                    return Err(CliError::Argument(format!(
                        "--fail-closed: {c} is not steered (--chains {})",
                        chains.join(",")
                    )));
                }
                closed
            }
        };
        let mut exempt = Vec::new();
        for p in a
            .exempt_tcp_ports
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let port = p.parse::<u16>().map_err(|_| {
                CliError::Argument(format!("--exempt-tcp-ports: `{p}` is not a port"))
            })?;
            exempt.push(port);
        }
        // multiport takes at most 15 ports.
        if exempt.len() > 15 {
            return Err(CliError::Argument(
                "--exempt-tcp-ports: at most 15 ports (iptables multiport)".into(),
            ));
        }
        Ok(Plan {
            skip_mark: (a.mode == Mode::Continue).then_some(a.mark),
            reject_mark: a.reject_mark,
            facts_mark: a.facts_mark,
            first: a.queue_first,
            count: a.queues,
            closed,
            new_only: a.new_only,
            cpu_fanout: a.queue_cpu_fanout,
            chains,
            loopback: a.include_loopback,
            exempt,
        })
    }

    /// Whether the steered chains differ in their bypass choice (then the fail-closed ones
    /// jump to [`CHAIN_CLOSED`]).
    fn mixed(&self) -> bool {
        !self.closed.is_empty() && self.closed.len() < self.chains.len()
    }

    /// The steering chain builtin chain `c` jumps to.
    fn chain_of(&self, c: &str) -> &'static str {
        if self.mixed() && self.closed.contains(&c) {
            CHAIN_CLOSED
        } else {
            CHAIN
        }
    }

    /// Whether the rules of steering chain `steering` keep `--queue-bypass`.
    fn bypass(&self, steering: &str) -> bool {
        if self.mixed() {
            steering == CHAIN
        } else {
            self.closed.is_empty()
        }
    }

    /// The NFQUEUE target's options in [`CHAIN`].
    fn target(&self) -> String {
        self.target_of(CHAIN)
    }

    /// The NFQUEUE target's options in steering chain `steering`.
    fn target_of(&self, steering: &str) -> String {
        let q = if self.count == 1 {
            format!("--queue-num {}", self.first)
        } else {
            format!(
                "--queue-balance {}:{}",
                self.first,
                u32::from(self.first) + u32::from(self.count) - 1
            )
        };
        // In the order iptables-save prints them (libxt_NFQUEUE's NFQUEUE_save_v3).
        let mut t = q;
        if self.bypass(steering) {
            t.push_str(" --queue-bypass");
        }
        if self.cpu_fanout {
            t.push_str(" --queue-cpu-fanout");
        }
        t
    }

    /// The steering chains this plan writes.
    fn steering_chains(&self) -> Vec<&'static str> {
        if self.mixed() {
            vec![CHAIN, CHAIN_CLOSED]
        } else {
            vec![CHAIN]
        }
    }
}

/// The builtin filter chains named in `list` (any case, duplicates once), for flag `flag`.
///
/// Errors: a name that is not INPUT, OUTPUT or FORWARD.
fn builtin_chains(flag: &str, list: &[String]) -> Result<Vec<&'static str>, CliError> {
    let mut chains = Vec::new();
    for c in list {
        let up = c.trim().to_ascii_uppercase();
        let Some(b) = BUILTIN.iter().find(|b| **b == up) else {
            return Err(CliError::Argument(format!(
                "{flag}: `{c}` is not a builtin chain of the filter table (INPUT, OUTPUT, FORWARD)"
            )));
        };
        if !chains.contains(b) {
            chains.push(*b);
        }
    }
    Ok(chains)
}

/// The reject chains of `family` (`VALLUM-REJECT` first, then one per answer the family's
/// REJECT has, with the answer's code and `--reject-with` name).
fn reject_chains(family: Family) -> Vec<(String, u8, &'static str)> {
    RejectWith::ALL
        .iter()
        .zip(REJECT_SUFFIX)
        .filter_map(|(w, suffix)| {
            let name = w.name(family)?;
            Some((format!("{REJECT_CHAIN}-{suffix}"), w.code(), name))
        })
        .collect()
}

/// Every chain an install may write besides [`CHAIN`], for uninstall and for removing what a
/// later install does not write.
fn our_other_chains() -> Vec<String> {
    let mut all = vec![CHAIN_CLOSED.to_owned(), REJECT_CHAIN.to_owned()];
    all.extend(REJECT_SUFFIX.iter().map(|s| format!("{REJECT_CHAIN}-{s}")));
    all.extend(BUILTIN.iter().map(|c| facts_chain(c)));
    all
}

/// The iptables-restore input that installs `plan` for `family`, given the `iptables -S`
/// lines of the filter table now (their jumps to [`CHAIN`] are deleted, then one per chosen
/// chain is inserted at the top).
fn install_text(plan: &Plan, family: Family, current: &str) -> String {
    let steering = plan.steering_chains();
    let rejects = if plan.reject_mark != 0 {
        reject_chains(family)
    } else {
        Vec::new()
    };
    let mut written: Vec<String> = steering.iter().map(|s| s.to_string()).collect();
    if !rejects.is_empty() {
        written.push(REJECT_CHAIN.to_owned());
        written.extend(rejects.iter().map(|r| r.0.clone()));
    }
    let facts: Vec<String> = if plan.facts_mark != 0 {
        plan.chains.iter().map(|c| facts_chain(c)).collect()
    } else {
        Vec::new()
    };
    written.extend(facts.iter().cloned());
    let mut t = String::from("*filter\n");
    for c in &written {
        // A facts chain that exists keeps the rules vallumd wrote (declaring it would empty
        // it until vallumd's next commit).
        if facts.contains(c) && has_chain(current, c) {
            continue;
        }
        t.push_str(&format!(":{c} - [0:0]\n"));
    }
    for d in jumps(current) {
        t.push_str(&format!("-D {d}\n"));
    }
    // Chains of an earlier install this one does not write: emptied first, then deleted (one
    // may jump to another).
    let old: Vec<String> = our_other_chains()
        .into_iter()
        .filter(|c| !written.contains(c) && has_chain(current, c))
        .collect();
    for c in &old {
        t.push_str(&format!("-F {c}\n"));
    }
    for c in &old {
        t.push_str(&format!("-X {c}\n"));
    }
    let r = plan.reject_mark;
    for s in &steering {
        if !rejects.is_empty() {
            t.push_str(&format!(
                "-A {s} -m mark ! --mark 0x0/{r:#x} -j {REJECT_CHAIN}\n"
            ));
        }
        if let Some(m) = plan.skip_mark {
            t.push_str(&format!("-A {s} -m mark --mark {m:#x}/{m:#x} -j RETURN\n"));
        }
        if !plan.loopback {
            t.push_str(&format!("-A {s} -i lo -j RETURN\n"));
            t.push_str(&format!("-A {s} -o lo -j RETURN\n"));
        }
        if !plan.exempt.is_empty() {
            let ports: Vec<String> = plan.exempt.iter().map(u16::to_string).collect();
            let ports = ports.join(",");
            t.push_str(&format!(
                "-A {s} -p tcp -m multiport --dports {ports} -j RETURN\n"
            ));
            t.push_str(&format!(
                "-A {s} -p tcp -m multiport --sports {ports} -j RETURN\n"
            ));
        }
        if plan.new_only {
            t.push_str(&format!(
                "-A {s} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
            ));
        }
        t.push_str(&format!("-A {s} -j NFQUEUE {}\n", plan.target_of(s)));
    }
    let shift = r.trailing_zeros() % 32;
    // tcp-reset is valid only with `-p tcp` (the kernel's reject_tg_check).
    let tcp = |name: &str| if name == "tcp-reset" { "-p tcp " } else { "" };
    for (chain, code, name) in &rejects {
        let v = u32::from(*code) << shift;
        t.push_str(&format!(
            "-A {REJECT_CHAIN} {}-m mark --mark {v:#x}/{r:#x} -j {chain}\n",
            tcp(name)
        ));
    }
    for (chain, _, name) in &rejects {
        t.push_str(&format!("-A {chain} -j MARK --set-xmark 0x0/{r:#x}\n"));
        t.push_str(&format!(
            "-A {chain} {}-j REJECT --reject-with {name}\n",
            tcp(name)
        ));
    }
    for c in &plan.chains {
        t.push_str(&format!("-I {c} 1 -j {}\n", plan.chain_of(c)));
    }
    // The facts chains run first: the kernel's matches set their bits before the NFQUEUE rule.
    if !facts.is_empty() {
        for c in &plan.chains {
            t.push_str(&format!("-I {c} 1 -j {}\n", facts_chain(c)));
        }
    }
    t.push_str("COMMIT\n");
    t
}

/// Whether `iptables -S` output `current` declares chain `name`.
fn has_chain(current: &str, name: &str) -> bool {
    current.lines().any(|l| l.trim() == format!("-N {name}"))
}

/// The iptables-restore input that removes every jump to [`CHAIN`] and every chain an install
/// writes (all emptied first, then deleted); `None` when none exists.
fn uninstall_text(current: &str) -> Option<String> {
    let mut all = vec![CHAIN.to_owned()];
    all.extend(our_other_chains());
    let exists: Vec<String> = all.into_iter().filter(|c| has_chain(current, c)).collect();
    let jumps = jumps(current);
    if exists.is_empty() && jumps.is_empty() {
        return None;
    }
    let mut t = String::from("*filter\n");
    for d in jumps {
        t.push_str(&format!("-D {d}\n"));
    }
    for c in &exists {
        t.push_str(&format!("-F {c}\n"));
    }
    for c in &exists {
        t.push_str(&format!("-X {c}\n"));
    }
    t.push_str("COMMIT\n");
    Some(t)
}

/// The rule specs (after `-A `) of the builtin chains' rules that jump to [`CHAIN`],
/// [`CHAIN_CLOSED`] or a facts chain.
fn jumps(current: &str) -> Vec<String> {
    current
        .lines()
        .filter_map(|l| l.trim().strip_prefix("-A "))
        .filter(|spec| {
            let chain = spec.split_whitespace().next().unwrap_or("");
            let mut words = spec.split_whitespace();
            BUILTIN.contains(&chain)
                && words.any(|w| w == "-j" || w == "-g")
                && words.next().is_some_and(|t| {
                    t == CHAIN || t == CHAIN_CLOSED || BUILTIN.iter().any(|c| t == facts_chain(c))
                })
        })
        .map(str::to_owned)
        .collect()
}

/// The programs of one family.
#[derive(Debug)]
struct Tools {
    family: &'static str,
    iptables: PathBuf,
    restore: PathBuf,
}

/// `iptables-legacy` -> (`ip6tables-legacy` for IPv6) and `…-restore`.
fn tools(iptables: &Path, family: FamilyChoice) -> Vec<Tools> {
    let name = iptables
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "iptables".to_owned());
    let with_name = |n: String| -> PathBuf {
        if iptables.components().count() > 1 {
            iptables.with_file_name(n)
        } else {
            PathBuf::from(n)
        }
    };
    let v6 = name.replacen("iptables", "ip6tables", 1);
    let mut out = Vec::new();
    if family != FamilyChoice::Ipv6 {
        out.push(Tools {
            family: "ipv4",
            iptables: with_name(name.clone()),
            restore: with_name(format!("{name}-restore")),
        });
    }
    if family != FamilyChoice::Ipv4 {
        out.push(Tools {
            family: "ipv6",
            iptables: with_name(v6.clone()),
            restore: with_name(format!("{v6}-restore")),
        });
    }
    out
}

fn tool_error(program: &Path, what: &str) -> CliError {
    CliError::Dataplane(format!("{}: {what}", program.display()))
}

/// `iptables -w -t filter -S`.
fn list(t: &Tools) -> Result<String, CliError> {
    let out = Command::new(&t.iptables)
        .args(["-w", "-t", "filter", "-S"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| tool_error(&t.iptables, &format!("cannot run: {e}")))?;
    if !out.status.success() {
        return Err(tool_error(
            &t.iptables,
            &format!(
                "-t filter -S failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| tool_error(&t.iptables, "output is not UTF-8"))
}

/// `iptables-restore -w --noflush` < `text`.
fn restore(t: &Tools, text: &str) -> Result<(), CliError> {
    let mut child = Command::new(&t.restore)
        .args(["-w", "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| tool_error(&t.restore, &format!("cannot run: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| tool_error(&t.restore, &format!("write input: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| tool_error(&t.restore, &format!("wait: {e}")))?;
    if !out.status.success() {
        return Err(tool_error(
            &t.restore,
            &format!(
                "--noflush failed ({}): {}\ninput was:\n{text}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

/// Runs a `dataplane` subcommand; returns the JSON report and its text form.
///
/// Errors: [`CliError::Argument`] for bad flags, [`CliError::Dataplane`] when an iptables
/// program cannot run or fails (the message has its stderr and, for restore, its input).
pub fn run(cmd: &DataplaneCommand) -> Result<(Value, String), CliError> {
    let mut report = Vec::new();
    let mut text = String::new();
    match cmd {
        DataplaneCommand::Install(a) => {
            let plan = Plan::from_args(a)?;
            for t in tools(&a.tool.iptables, a.tool.family) {
                let current = if a.tool.dry_run {
                    String::new()
                } else {
                    list(&t)?
                };
                let family = if t.family == "ipv6" {
                    Family::Ipv6
                } else {
                    Family::Ipv4
                };
                let input = install_text(&plan, family, &current);
                if a.tool.dry_run {
                    text.push_str(&format!(
                        "# {} ({})\n{input}",
                        t.family,
                        t.restore.display()
                    ));
                } else {
                    restore(&t, &input)?;
                    let closed = if plan.mixed() {
                        format!(
                            "; {} -> {CHAIN_CLOSED} -> NFQUEUE {}",
                            plan.closed.join(","),
                            plan.target_of(CHAIN_CLOSED)
                        )
                    } else {
                        String::new()
                    };
                    text.push_str(&format!(
                        "{}: filter {} -> {CHAIN} -> NFQUEUE {}{closed}{}{}{}{}{} ({})\n",
                        t.family,
                        plan.chains
                            .iter()
                            .filter(|c| plan.chain_of(c) == CHAIN)
                            .copied()
                            .collect::<Vec<_>>()
                            .join(","),
                        plan.target(),
                        match plan.skip_mark {
                            Some(m) => format!("; mode continue, mark {m:#x} returns"),
                            None => "; mode final".to_owned(),
                        },
                        if plan.new_only {
                            "; ESTABLISHED,RELATED accepted in the kernel"
                        } else {
                            ""
                        },
                        if plan.reject_mark == 0 {
                            "; REJECT drops (no reject rules)".to_owned()
                        } else {
                            format!("; REJECT by the kernel, mark {:#x}", plan.reject_mark)
                        },
                        if plan.loopback { "" } else { "; lo exempt" },
                        if plan.exempt.is_empty() {
                            String::new()
                        } else {
                            let p: Vec<String> = plan.exempt.iter().map(u16::to_string).collect();
                            format!("; tcp ports {} exempt", p.join(","))
                        },
                        t.restore.display()
                    ));
                }
                report.push(json!({
                    "family": t.family,
                    "program": t.restore.display().to_string(),
                    "mode": if plan.skip_mark.is_some() { "continue" } else { "final" },
                    "continue_mark": plan.skip_mark,
                    "reject_mark": plan.reject_mark,
                    "facts_mark": plan.facts_mark,
                    "chains": plan.chains,
                    "queue_first": plan.first,
                    "queue_count": plan.count,
                    "queue_bypass": plan.closed.is_empty(),
                    "fail_closed_chains": plan.closed,
                    "new_only": plan.new_only,
                    "queue_cpu_fanout": plan.cpu_fanout,
                    "loopback_exempt": !plan.loopback,
                    "exempt_tcp_ports": plan.exempt,
                    "applied": !a.tool.dry_run,
                    "input": input,
                }));
            }
            Ok((json!({"installed": report}), text))
        }
        DataplaneCommand::Uninstall(tool) => {
            for t in tools(&tool.iptables, tool.family) {
                let current = list(&t)?;
                let input = uninstall_text(&current);
                match &input {
                    None => text.push_str(&format!(
                        "{}: no {CHAIN} chain, nothing to remove\n",
                        t.family
                    )),
                    Some(i) if tool.dry_run => {
                        text.push_str(&format!("# {} ({})\n{i}", t.family, t.restore.display()))
                    }
                    Some(i) => {
                        restore(&t, i)?;
                        text.push_str(&format!("{}: removed {CHAIN} and its jumps\n", t.family));
                    }
                }
                report.push(json!({
                    "family": t.family,
                    "program": t.restore.display().to_string(),
                    "removed": input.is_some() && !tool.dry_run,
                    "input": input,
                }));
            }
            Ok((json!({"uninstalled": report}), text))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(subcommand)]
        cmd: DataplaneCommand,
    }

    fn plan(args: &[&str]) -> Result<Plan, CliError> {
        // The layout tests below leave the reject rules out (`reject_rules_per_family` has
        // them) unless they name --reject-mark.
        let mut all = vec!["t", "install"];
        if !args.contains(&"--reject-mark") {
            all.extend_from_slice(&["--reject-mark", "0"]);
        }
        all.extend_from_slice(args);
        match T::try_parse_from(all)
            .map_err(|e| CliError::Argument(e.to_string()))?
            .cmd
        {
            DataplaneCommand::Install(a) => Plan::from_args(&a),
            DataplaneCommand::Uninstall(_) => unreachable!(),
        }
    }

    #[test]
    fn install_text_is_the_documented_layout() {
        let p = plan(&["--queues", "4"]).unwrap();
        let t = install_text(&p, Family::Ipv4, "");
        assert_eq!(
            t,
            "*filter\n\
             :VALLUM-NFQUEUE - [0:0]\n\
             -A VALLUM-NFQUEUE -i lo -j RETURN\n\
             -A VALLUM-NFQUEUE -o lo -j RETURN\n\
             -A VALLUM-NFQUEUE -p tcp -m multiport --dports 22,50051,9464 -j RETURN\n\
             -A VALLUM-NFQUEUE -p tcp -m multiport --sports 22,50051,9464 -j RETURN\n\
             -A VALLUM-NFQUEUE -j NFQUEUE --queue-balance 0:3 --queue-bypass\n\
             -I INPUT 1 -j VALLUM-NFQUEUE\n\
             -I OUTPUT 1 -j VALLUM-NFQUEUE\n\
             -I FORWARD 1 -j VALLUM-NFQUEUE\n\
             COMMIT\n"
        );
    }

    #[test]
    fn install_options() {
        let p = plan(&[
            "--queue-first",
            "7",
            "--queue-count",
            "1",
            "--fail-closed",
            "--chains",
            "forward,FORWARD",
            "--include-loopback",
            "--exempt-tcp-ports",
            "",
        ])
        .unwrap();
        assert_eq!(
            install_text(&p, Family::Ipv4, ""),
            "*filter\n:VALLUM-NFQUEUE - [0:0]\n-A VALLUM-NFQUEUE -j NFQUEUE --queue-num 7\n\
             -I FORWARD 1 -j VALLUM-NFQUEUE\nCOMMIT\n"
        );
        let fanout = plan(&["--queues", "2", "--queue-cpu-fanout", "--chains", "INPUT"]).unwrap();
        assert_eq!(
            fanout.target(),
            "--queue-balance 0:1 --queue-bypass --queue-cpu-fanout"
        );
        assert!(plan(&["--queues", "1", "--queue-cpu-fanout"]).is_err());
        assert!(plan(&["--chains", "PREROUTING"]).is_err());
        assert!(plan(&["--queues", "0"]).is_err());
        assert!(plan(&["--queue-first", "65535", "--queues", "2"]).is_err());
        assert!(plan(&["--exempt-tcp-ports", "22,x"]).is_err());
    }

    #[test]
    fn continue_mode_skips_the_mark_first() {
        let p = plan(&["--queues", "1", "--mode", "continue", "--chains", "INPUT"]).unwrap();
        assert_eq!(
            install_text(&p, Family::Ipv4, ""),
            "*filter\n:VALLUM-NFQUEUE - [0:0]\n\
             -A VALLUM-NFQUEUE -m mark --mark 0x40000000/0x40000000 -j RETURN\n\
             -A VALLUM-NFQUEUE -i lo -j RETURN\n\
             -A VALLUM-NFQUEUE -o lo -j RETURN\n\
             -A VALLUM-NFQUEUE -p tcp -m multiport --dports 22,50051,9464 -j RETURN\n\
             -A VALLUM-NFQUEUE -p tcp -m multiport --sports 22,50051,9464 -j RETURN\n\
             -A VALLUM-NFQUEUE -j NFQUEUE --queue-num 0 --queue-bypass\n\
             -I INPUT 1 -j VALLUM-NFQUEUE\nCOMMIT\n"
        );
        let p = plan(&["--mode", "continue", "--mark", "256"]).unwrap();
        assert_eq!(p.skip_mark, Some(0x100));
        assert!(
            install_text(&p, Family::Ipv4, "").contains("-m mark --mark 0x100/0x100 -j RETURN\n")
        );
        // The mark is ignored in final mode; a bad one is refused in either.
        assert_eq!(plan(&["--mark", "256"]).unwrap().skip_mark, None);
        for bad in ["0", "3", "0x", "x1"] {
            assert!(
                plan(&["--mode", "continue", "--mark", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn fail_closed_per_chain_uses_a_second_chain() {
        let p = plan(&[
            "--queues",
            "2",
            "--fail-closed",
            "input",
            "--exempt-tcp-ports",
            "",
        ])
        .unwrap();
        assert_eq!(
            install_text(&p, Family::Ipv4, ""),
            "*filter\n:VALLUM-NFQUEUE - [0:0]\n:VALLUM-NFQUEUE-CLOSED - [0:0]\n\
             -A VALLUM-NFQUEUE -i lo -j RETURN\n-A VALLUM-NFQUEUE -o lo -j RETURN\n\
             -A VALLUM-NFQUEUE -j NFQUEUE --queue-balance 0:1 --queue-bypass\n\
             -A VALLUM-NFQUEUE-CLOSED -i lo -j RETURN\n-A VALLUM-NFQUEUE-CLOSED -o lo -j RETURN\n\
             -A VALLUM-NFQUEUE-CLOSED -j NFQUEUE --queue-balance 0:1\n\
             -I INPUT 1 -j VALLUM-NFQUEUE-CLOSED\n-I OUTPUT 1 -j VALLUM-NFQUEUE\n\
             -I FORWARD 1 -j VALLUM-NFQUEUE\nCOMMIT\n"
        );
        // Every steered chain named: one chain, no bypass, as plain --fail-closed.
        let all = plan(&["--chains", "INPUT", "--fail-closed", "INPUT"]).unwrap();
        assert!(!all.mixed());
        assert_eq!(all.steering_chains(), [CHAIN]);
        assert!(!all.target().contains("bypass"));
        assert_eq!(
            plan(&["--chains", "INPUT", "--fail-closed"])
                .unwrap()
                .closed,
            ["INPUT"]
        );
        let e = plan(&["--chains", "INPUT", "--fail-closed", "FORWARD"]).unwrap_err();
        assert!(e.to_string().contains("FORWARD is not steered"), "{e}");
        assert!(plan(&["--fail-closed", "PREROUTING"]).is_err());
        // A later install without the split removes the second chain and its jumps.
        let current = "-N VALLUM-NFQUEUE\n-N VALLUM-NFQUEUE-CLOSED\n\
            -A INPUT -j VALLUM-NFQUEUE-CLOSED\n-A OUTPUT -j VALLUM-NFQUEUE\n";
        let t = install_text(
            &plan(&["--chains", "INPUT"]).unwrap(),
            Family::Ipv4,
            current,
        );
        assert!(
            t.contains(
                "-D INPUT -j VALLUM-NFQUEUE-CLOSED\n-D OUTPUT -j VALLUM-NFQUEUE\n\
                 -F VALLUM-NFQUEUE-CLOSED\n-X VALLUM-NFQUEUE-CLOSED\n"
            ),
            "{t}"
        );
        assert_eq!(
            uninstall_text(current).unwrap(),
            "*filter\n-D INPUT -j VALLUM-NFQUEUE-CLOSED\n-D OUTPUT -j VALLUM-NFQUEUE\n\
             -F VALLUM-NFQUEUE\n-F VALLUM-NFQUEUE-CLOSED\n-X VALLUM-NFQUEUE\n\
             -X VALLUM-NFQUEUE-CLOSED\nCOMMIT\n"
        );
    }

    #[test]
    fn new_only_accepts_established_before_the_queue() {
        let p = plan(&[
            "--queues",
            "1",
            "--new-only",
            "--chains",
            "INPUT",
            "--include-loopback",
            "--exempt-tcp-ports",
            "22",
        ])
        .unwrap();
        assert_eq!(
            install_text(&p, Family::Ipv4, ""),
            "*filter\n:VALLUM-NFQUEUE - [0:0]\n\
             -A VALLUM-NFQUEUE -p tcp -m multiport --dports 22 -j RETURN\n\
             -A VALLUM-NFQUEUE -p tcp -m multiport --sports 22 -j RETURN\n\
             -A VALLUM-NFQUEUE -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
             -A VALLUM-NFQUEUE -j NFQUEUE --queue-num 0 --queue-bypass\n\
             -I INPUT 1 -j VALLUM-NFQUEUE\nCOMMIT\n"
        );
    }

    // `iptables -S` of a namespace after one install, plus a user's own rules.
    const INSTALLED: &str = "-P INPUT ACCEPT\n-P FORWARD ACCEPT\n-P OUTPUT ACCEPT\n\
        -N VALLUM-NFQUEUE\n-N VALLUM-NFQUEUE-OTHER\n-A INPUT -j VALLUM-NFQUEUE\n\
        -A INPUT -p tcp -j ACCEPT\n-A INPUT -j VALLUM-NFQUEUE-OTHER\n\
        -A OUTPUT -o eth0 -j VALLUM-NFQUEUE\n\
        -A VALLUM-NFQUEUE -i lo -j RETURN\n\
        -A VALLUM-NFQUEUE -j NFQUEUE --queue-num 0 --queue-bypass\n";

    #[test]
    fn reinstall_replaces_every_jump() {
        let p = plan(&["--queues", "1", "--chains", "INPUT"]).unwrap();
        let t = install_text(&p, Family::Ipv4, INSTALLED);
        assert!(t.contains("-D INPUT -j VALLUM-NFQUEUE\n-D OUTPUT -o eth0 -j VALLUM-NFQUEUE\n"));
        assert!(!t.contains("-D INPUT -j VALLUM-NFQUEUE-OTHER"));
        assert!(!t.contains("-D INPUT -p tcp"));
        assert!(t.ends_with("-I INPUT 1 -j VALLUM-NFQUEUE\nCOMMIT\n"));
    }

    #[test]
    fn facts_chains_run_before_the_steering_and_keep_vallumds_rules() {
        let p = plan(&[
            "--queues",
            "1",
            "--chains",
            "INPUT,OUTPUT",
            "--exempt-tcp-ports",
            "",
            "--include-loopback",
            "--facts-mark",
            "0x00ff0000",
        ])
        .unwrap();
        assert_eq!(
            install_text(&p, Family::Ipv4, ""),
            "*filter\n:VALLUM-NFQUEUE - [0:0]\n:VALLUM-FACTS-INPUT - [0:0]\n\
             :VALLUM-FACTS-OUTPUT - [0:0]\n\
             -A VALLUM-NFQUEUE -j NFQUEUE --queue-num 0 --queue-bypass\n\
             -I INPUT 1 -j VALLUM-NFQUEUE\n-I OUTPUT 1 -j VALLUM-NFQUEUE\n\
             -I INPUT 1 -j VALLUM-FACTS-INPUT\n-I OUTPUT 1 -j VALLUM-FACTS-OUTPUT\nCOMMIT\n"
        );
        // Installed before, filled by vallumd: the chains are not declared again (that would
        // empty them), their jumps are replaced.
        let current = "-P INPUT ACCEPT\n-N VALLUM-NFQUEUE\n-N VALLUM-FACTS-INPUT\n\
                       -N VALLUM-FACTS-OUTPUT\n-A INPUT -j VALLUM-FACTS-INPUT\n\
                       -A INPUT -j VALLUM-NFQUEUE\n\
                       -A VALLUM-FACTS-INPUT -j MARK --set-xmark 0x0/0xff0000\n";
        let again = install_text(&p, Family::Ipv4, current);
        assert!(!again.contains(":VALLUM-FACTS-INPUT"), "{again}");
        assert!(
            again.contains("-D INPUT -j VALLUM-FACTS-INPUT\n-D INPUT -j VALLUM-NFQUEUE\n"),
            "{again}"
        );
        // Without --facts-mark, a later install and uninstall remove them.
        let plain = plan(&["--queues", "1", "--chains", "INPUT"]).unwrap();
        let t = install_text(&plain, Family::Ipv4, current);
        assert!(
            t.contains("-F VALLUM-FACTS-INPUT\n") && t.contains("-X VALLUM-FACTS-OUTPUT\n"),
            "{t}"
        );
        let u = uninstall_text(current).unwrap();
        assert!(u.contains("-D INPUT -j VALLUM-FACTS-INPUT\n"), "{u}");
        assert!(u.contains("-X VALLUM-FACTS-INPUT\n"), "{u}");
        // The field may not overlap the reject field or the continue bit.
        assert!(plan(&["--facts-mark", "0x0f000000", "--reject-mark", "0x0f000000"]).is_err());
        assert!(plan(&["--facts-mark", "0x00ff00ff"]).is_err());
    }

    #[test]
    fn uninstall_text_removes_jumps_then_chain() {
        assert_eq!(
            uninstall_text(INSTALLED).unwrap(),
            "*filter\n-D INPUT -j VALLUM-NFQUEUE\n-D OUTPUT -o eth0 -j VALLUM-NFQUEUE\n\
             -F VALLUM-NFQUEUE\n-X VALLUM-NFQUEUE\nCOMMIT\n"
        );
        assert_eq!(uninstall_text("-P INPUT ACCEPT\n-N OTHER\n"), None);
    }

    #[test]
    fn reject_rules_per_family() {
        let p = plan(&[
            "--queues",
            "1",
            "--chains",
            "INPUT",
            "--exempt-tcp-ports",
            "",
            "--include-loopback",
            "--reject-mark",
            "0x0f000000",
        ])
        .unwrap();
        assert_eq!(
            install_text(&p, Family::Ipv4, ""),
            "*filter\n:VALLUM-NFQUEUE - [0:0]\n:VALLUM-REJECT - [0:0]\n\
             :VALLUM-REJECT-NET-UNREACH - [0:0]\n:VALLUM-REJECT-HOST-UNREACH - [0:0]\n\
             :VALLUM-REJECT-PORT-UNREACH - [0:0]\n:VALLUM-REJECT-PROTO-UNREACH - [0:0]\n\
             :VALLUM-REJECT-NET-PROHIB - [0:0]\n:VALLUM-REJECT-HOST-PROHIB - [0:0]\n\
             :VALLUM-REJECT-ADMIN-PROHIB - [0:0]\n:VALLUM-REJECT-TCP-RESET - [0:0]\n\
             -A VALLUM-NFQUEUE -m mark ! --mark 0x0/0xf000000 -j VALLUM-REJECT\n\
             -A VALLUM-NFQUEUE -j NFQUEUE --queue-num 0 --queue-bypass\n\
             -A VALLUM-REJECT -m mark --mark 0x1000000/0xf000000 -j VALLUM-REJECT-NET-UNREACH\n\
             -A VALLUM-REJECT -m mark --mark 0x2000000/0xf000000 -j VALLUM-REJECT-HOST-UNREACH\n\
             -A VALLUM-REJECT -m mark --mark 0x3000000/0xf000000 -j VALLUM-REJECT-PORT-UNREACH\n\
             -A VALLUM-REJECT -m mark --mark 0x4000000/0xf000000 -j VALLUM-REJECT-PROTO-UNREACH\n\
             -A VALLUM-REJECT -m mark --mark 0x5000000/0xf000000 -j VALLUM-REJECT-NET-PROHIB\n\
             -A VALLUM-REJECT -m mark --mark 0x6000000/0xf000000 -j VALLUM-REJECT-HOST-PROHIB\n\
             -A VALLUM-REJECT -m mark --mark 0x7000000/0xf000000 -j VALLUM-REJECT-ADMIN-PROHIB\n\
             -A VALLUM-REJECT -p tcp -m mark --mark 0x8000000/0xf000000 -j VALLUM-REJECT-TCP-RESET\n\
             -A VALLUM-REJECT-NET-UNREACH -j MARK --set-xmark 0x0/0xf000000\n\
             -A VALLUM-REJECT-NET-UNREACH -j REJECT --reject-with icmp-net-unreachable\n\
             -A VALLUM-REJECT-HOST-UNREACH -j MARK --set-xmark 0x0/0xf000000\n\
             -A VALLUM-REJECT-HOST-UNREACH -j REJECT --reject-with icmp-host-unreachable\n\
             -A VALLUM-REJECT-PORT-UNREACH -j MARK --set-xmark 0x0/0xf000000\n\
             -A VALLUM-REJECT-PORT-UNREACH -j REJECT --reject-with icmp-port-unreachable\n\
             -A VALLUM-REJECT-PROTO-UNREACH -j MARK --set-xmark 0x0/0xf000000\n\
             -A VALLUM-REJECT-PROTO-UNREACH -j REJECT --reject-with icmp-proto-unreachable\n\
             -A VALLUM-REJECT-NET-PROHIB -j MARK --set-xmark 0x0/0xf000000\n\
             -A VALLUM-REJECT-NET-PROHIB -j REJECT --reject-with icmp-net-prohibited\n\
             -A VALLUM-REJECT-HOST-PROHIB -j MARK --set-xmark 0x0/0xf000000\n\
             -A VALLUM-REJECT-HOST-PROHIB -j REJECT --reject-with icmp-host-prohibited\n\
             -A VALLUM-REJECT-ADMIN-PROHIB -j MARK --set-xmark 0x0/0xf000000\n\
             -A VALLUM-REJECT-ADMIN-PROHIB -j REJECT --reject-with icmp-admin-prohibited\n\
             -A VALLUM-REJECT-TCP-RESET -j MARK --set-xmark 0x0/0xf000000\n\
             -A VALLUM-REJECT-TCP-RESET -p tcp -j REJECT --reject-with tcp-reset\n\
             -I INPUT 1 -j VALLUM-NFQUEUE\nCOMMIT\n"
        );
        let v6 = install_text(&p, Family::Ipv6, "");
        for (code, name, chain) in [
            (1, "icmp6-no-route", "NET-UNREACH"),
            (2, "icmp6-addr-unreachable", "HOST-UNREACH"),
            (3, "icmp6-port-unreachable", "PORT-UNREACH"),
            (7, "icmp6-adm-prohibited", "ADMIN-PROHIB"),
            (9, "icmp6-policy-fail", "POLICY-FAIL"),
            (10, "icmp6-reject-route", "REJECT-ROUTE"),
        ] {
            assert!(
                v6.contains(&format!(
                    "-A VALLUM-REJECT -m mark --mark {:#x}/0xf000000 -j VALLUM-REJECT-{chain}\n",
                    code << 24
                )),
                "{chain}: {v6}"
            );
            assert!(
                v6.contains(&format!(
                    "-A VALLUM-REJECT-{chain} -j REJECT --reject-with {name}\n"
                )),
                "{name}: {v6}"
            );
        }
        assert!(
            !v6.contains("PROTO-UNREACH") && !v6.contains("HOST-PROHIB"),
            "{v6}"
        );
        // The continue bit comes after the reject gate; it may not overlap the field.
        let c = plan(&["--mode", "continue", "--reject-mark", "0xf0"]).unwrap();
        let t = install_text(&c, Family::Ipv4, "");
        assert!(
            t.contains(
                "-A VALLUM-NFQUEUE -m mark ! --mark 0x0/0xf0 -j VALLUM-REJECT\n\
                 -A VALLUM-NFQUEUE -m mark --mark 0x40000000/0x40000000 -j RETURN\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("-m mark --mark 0x80/0xf0 -j VALLUM-REJECT-TCP-RESET"),
            "{t}"
        );
        let e = plan(&[
            "--mode",
            "continue",
            "--mark",
            "0x4000000",
            "--reject-mark",
            "0x0f000000",
        ])
        .unwrap_err();
        assert!(e.to_string().contains("do not overlap"), "{e}");
        for bad in ["0x7", "0x0f0f", "x"] {
            assert!(plan(&["--reject-mark", bad]).is_err(), "{bad}");
        }
        // A later install with --reject-mark 0 removes them; uninstall removes them.
        let current = "-N VALLUM-NFQUEUE\n-N VALLUM-REJECT\n-N VALLUM-REJECT-TCP-RESET\n\
            -A INPUT -j VALLUM-NFQUEUE\n";
        let t = install_text(
            &plan(&["--chains", "INPUT"]).unwrap(),
            Family::Ipv4,
            current,
        );
        assert!(
            t.contains(
                "-F VALLUM-REJECT\n-F VALLUM-REJECT-TCP-RESET\n-X VALLUM-REJECT\n\
                 -X VALLUM-REJECT-TCP-RESET\n"
            ),
            "{t}"
        );
        assert_eq!(
            uninstall_text(current).unwrap(),
            "*filter\n-D INPUT -j VALLUM-NFQUEUE\n-F VALLUM-NFQUEUE\n-F VALLUM-REJECT\n\
             -F VALLUM-REJECT-TCP-RESET\n-X VALLUM-NFQUEUE\n-X VALLUM-REJECT\n\
             -X VALLUM-REJECT-TCP-RESET\nCOMMIT\n"
        );
    }

    #[test]
    fn tool_names() {
        let t = tools(Path::new("/usr/sbin/iptables-legacy"), FamilyChoice::Both);
        assert_eq!(t[0].restore, Path::new("/usr/sbin/iptables-legacy-restore"));
        assert_eq!(t[1].iptables, Path::new("/usr/sbin/ip6tables-legacy"));
        assert_eq!(
            t[1].restore,
            Path::new("/usr/sbin/ip6tables-legacy-restore")
        );
        let t = tools(Path::new("iptables"), FamilyChoice::Ipv6);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].restore, Path::new("ip6tables-restore"));
    }
}
