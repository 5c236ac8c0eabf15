//! `vallumd --kernel-tables nat,mangle`: the tables vallumd stores but does not enforce are
//! handed to the kernel, so that Docker's port publishing and kube-proxy's Services (nat) keep
//! working behind the drop-in `vallum-iptables`, while filter and raw stay vallumd's.
//!
//! What the kernel gets. For each family and each configured table, the merge of that table
//! over every active ruleset, in the order the engine runs rulesets (ascending priority, then
//! name): the rules of a builtin chain are the rulesets' rules one after the other, a user
//! chain comes from the one ruleset that declares it, and a builtin chain's policy is ACCEPT
//! unless a ruleset sets another one. Two rulesets that declare the same user chain, or
//! different policies for one builtin chain, cannot both be in the kernel's one table: the
//! commit that would make that so is refused (KERNEL_TABLES_REFUSED) before anything is
//! stored. A table no ruleset has is empty in the kernel: vallumd owns the kernel's copy of
//! every configured table (a rule put there by hand is drift, below).
//!
//! How. `iptables-nft-restore` (and `ip6tables-nft-restore`), the kernel's own tool, with the
//! text of those tables only and without `--noflush`: iptables-restore flushes and replaces
//! exactly the tables its input names and leaves the others alone (the kernel's filter table
//! keeps the NFQUEUE steering of `vallumctl dataplane install`). With nft it is one netlink
//! transaction per family: the kernel takes all of the family's tables or none. Why not
//! `--noflush`: it would keep the old rules of the builtin chains and need an `-F`/`-X` per
//! chain to replace them, the same text and more ways to go wrong. Why not a netlink crate:
//! the rules are iptables rules (xt matches and targets inside nft expressions, as
//! iptables-nft writes them, which is what `iptables-nft-save` and the kernel's users read
//! back), and no maintained crate encodes those; the nftables crates (`nftables`, which
//! drives `nft -j`, `rustables`, `nftnl`) speak native nft expressions. Without
//! `iptables-nft-restore` on PATH, `iptables-legacy-restore` is used (one replace per table,
//! so a family's tables are not one transaction there); `--kernel-tables-restore` names
//! another program. The program must not be `vallum-iptables` (the drop-in writes vallumd,
//! not the kernel): vallumd refuses to start then.
//!
//! Order with the commit ([`crate::control::pipeline`]): validate, persist (durable), **kernel
//! tables**, then publish our own snapshot. A commit that does not change any configured
//! table's merged text runs no program. When the kernel refuses the text the commit fails
//! (KERNEL_TABLES_REFUSED, the program's message with the refused line), the store is
//! reverted and nothing is published; when the publish fails after the kernel took the
//! tables, the previous text is restored. IPv4 is written before IPv6; when IPv6 is refused
//! the IPv4 text is put back. At start, after the stored state is loaded, every configured
//! table is written once (a crash between the store and the kernel is mended there); when
//! the kernel refuses the stored tables vallumd does not start (KERNEL_TABLES_REFUSED).
//!
//! Drift: every `--kernel-tables-check-interval` and on each `GetStatus` (`vallumctl
//! status`), `iptables-nft-save -t TABLE` of each family is parsed and printed canonically
//! (counters ignored) and compared with the text vallumd last wrote; the gauge
//! `vallum_kernel_tables_drift{family,table}` is 1 when they differ (or the kernel's text
//! cannot be read or parsed), else 0, and GetStatus lists each table with what differs. A
//! table found drifted is written again by the next commit of a ruleset that has kernel
//! tables (or the next start); a commit of a filter-only ruleset does not touch the kernel.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use vallum_engine::model::{Chain, Family, Policy, Ruleset, Table, TableKind};
use vallum_engine::restore::{self, ParseOptions, PrintOptions};

use crate::error::{Error, Result};

/// The longest a kernel tool may run before it is killed and the commit fails.
const TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// The families, in the order they are written.
const FAMILIES: [Family; 2] = [Family::Ipv4, Family::Ipv6];

/// `--kernel-tables` flags; flattened into [`crate::config::Config`].
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct KernelTablesArgs {
    /// Tables vallumd does not enforce that it hands to the kernel, comma-separated: nat,
    /// mangle, security (filter and raw are vallumd's own). Empty: none (stored only).
    #[arg(
        long,
        env = "VALLUM_KERNEL_TABLES",
        value_delimiter = ',',
        value_parser = parse_kernel_table
    )]
    pub kernel_tables: Vec<TableKind>,

    /// The kernel's IPv4 restore program; the IPv6 one is the same name with `ip6tables`,
    /// the save programs end in `-save` instead of `-restore`. Default:
    /// `iptables-nft-restore` when it is on PATH, else `iptables-legacy-restore`. It also
    /// writes the steering's facts chains (`--nfqueue-facts-mark`): name the backend the
    /// steering was installed with.
    #[arg(long, env = "VALLUM_KERNEL_TABLES_RESTORE", value_name = "PATH")]
    pub kernel_tables_restore: Option<PathBuf>,

    /// Seconds between two drift checks of the kernel tables (also checked on each
    /// GetStatus).
    #[arg(long, env = "VALLUM_KERNEL_TABLES_CHECK_INTERVAL", default_value = "10",
          value_parser = parse_interval)]
    pub kernel_tables_check_interval: Duration,
}

/// Parses one `--kernel-tables` item.
///
/// Errors: filter and raw (vallumd enforces them), or a name that is no table.
pub fn parse_kernel_table(s: &str) -> std::result::Result<TableKind, String> {
    match TableKind::from_name(s) {
        Some(k) if k.is_enforced() => Err(format!(
            "{s:?} is enforced by vallumd itself; --kernel-tables takes nat, mangle, security"
        )),
        Some(k) => Ok(k),
        None => Err(format!("{s:?} is not a table (nat, mangle, security)")),
    }
}

fn parse_interval(s: &str) -> std::result::Result<Duration, String> {
    let secs: f64 = s
        .trim_end_matches('s')
        .parse()
        .map_err(|e| format!("{s:?}: {e} (seconds)"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("{s:?}: must be more than 0 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The programs of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tools {
    pub(crate) restore: PathBuf,
    pub(crate) save: PathBuf,
}

/// `.../iptables-nft-restore` -> (restore, save) of `family` (`ip6tables-nft-restore`,
/// `iptables-nft-save`, ...).
pub(crate) fn tools_of(restore: &Path, family: Family) -> std::result::Result<Tools, String> {
    let name = restore
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: not a program name", restore.display()))?;
    let stem = name.strip_suffix("-restore").ok_or_else(|| {
        format!(
            "{}: the restore program's name ends in -restore",
            restore.display()
        )
    })?;
    if !stem.contains("iptables") {
        return Err(format!(
            "{}: the restore program's name contains iptables",
            restore.display()
        ));
    }
    let stem = match family {
        Family::Ipv4 => stem.to_string(),
        Family::Ipv6 => stem.replacen("iptables", "ip6tables", 1),
    };
    Ok(Tools {
        restore: restore.with_file_name(format!("{stem}-restore")),
        save: restore.with_file_name(format!("{stem}-save")),
    })
}

/// `program` resolved on PATH (as given when it has a directory).
pub(crate) fn on_path(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(program))
            .find(|c| c.is_file())
    })
}

/// What one table of the kernel looks like against vallumd's copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableDrift {
    /// IPv4 or IPv6.
    pub family: Family,
    /// nat, mangle or security.
    pub table: TableKind,
    /// The kernel's table differs from what vallumd wrote (or could not be read).
    pub drift: bool,
    /// What differs (the lines added in the kernel and those missing from it), why the
    /// kernel's table could not be read, or empty when in sync.
    pub detail: String,
    /// When it was checked, Unix ns (0: not yet).
    pub checked_at: i64,
}

/// What the kernel tables become with a commit: each configured table's canonical text, for
/// the families whose text changes.
#[derive(Debug)]
pub struct Next {
    texts: BTreeMap<(Family, TableKind), String>,
    families: Vec<Family>,
}

/// The kernel's texts before a write, to put back when what follows it fails.
#[derive(Debug)]
pub struct Undo(Next);

/// The kernel tables of one vallumd.
pub struct KernelTables {
    kinds: Vec<TableKind>,
    tools: [Tools; 2],
    interval: Duration,
    /// The canonical text of each (family, table) vallumd last wrote to the kernel; empty
    /// until the start's [`KernelTables::sync`].
    applied: Mutex<BTreeMap<(Family, TableKind), String>>,
    /// One kernel program at a time: a drift check never reads a table half written.
    running: tokio::sync::Mutex<()>,
    /// The last check's result per table, read by the metric's callback and GetStatus.
    drift: DriftMap,
    /// The wall clock of [`TableDrift::checked_at`].
    clock: crate::clock::Clock,
}

impl std::fmt::Debug for KernelTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelTables")
            .field("kinds", &self.kinds)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl KernelTables {
    /// The kernel tables of `args`; `None` without `--kernel-tables`. Drift checks are
    /// timed on `clock`.
    ///
    /// Errors: [`Error::Startup`] (KERNEL_TABLES_REFUSED) when no restore program is found,
    /// its name does not say which save program goes with it, or it is `vallum-iptables`.
    pub fn new(
        args: &KernelTablesArgs,
        clock: crate::clock::Clock,
    ) -> Result<Option<KernelTables>> {
        let mut kinds = args.kernel_tables.clone();
        kinds.sort();
        kinds.dedup();
        if kinds.is_empty() {
            return Ok(None);
        }
        let startup = |message: String| Error::Startup {
            code: crate::error::Reason::KernelTablesRefused.info().name,
            message,
        };
        let restore = match &args.kernel_tables_restore {
            Some(p) => p.clone(),
            None => ["iptables-nft-restore", "iptables-legacy-restore"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| on_path(p).is_some())
                .ok_or_else(|| {
                    startup(
                        "--kernel-tables: neither iptables-nft-restore nor \
                         iptables-legacy-restore is on PATH (or give --kernel-tables-restore)"
                            .into(),
                    )
                })?,
        };
        let found = on_path(&restore)
            .ok_or_else(|| startup(format!("--kernel-tables: {} not found", restore.display())))?;
        if std::fs::canonicalize(&found)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .is_some_and(|n| n == "vallum-iptables")
        {
            return Err(startup(format!(
                "--kernel-tables: {} is vallum-iptables, which writes vallumd, not the \
                 kernel; name the kernel's tool (iptables-nft-restore) with \
                 --kernel-tables-restore",
                found.display()
            )));
        }
        let tools = [
            tools_of(&restore, Family::Ipv4).map_err(startup)?,
            tools_of(&restore, Family::Ipv6).map_err(startup)?,
        ];
        Ok(Some(KernelTables {
            kinds,
            tools,
            interval: args.kernel_tables_check_interval,
            applied: Mutex::new(BTreeMap::new()),
            running: tokio::sync::Mutex::new(()),
            drift: Arc::default(),
            clock,
        }))
    }

    /// The configured tables, in [`TableKind`] order.
    pub fn kinds(&self) -> &[TableKind] {
        &self.kinds
    }

    fn tools(&self, family: Family) -> &Tools {
        match family {
            Family::Ipv4 => &self.tools[0],
            Family::Ipv6 => &self.tools[1],
        }
    }

    /// The tables of `ruleset` that go to the kernel (cheap: chains share their rules).
    pub fn tables_of(&self, ruleset: &Ruleset) -> Vec<Table> {
        ruleset
            .tables
            .iter()
            .filter(|t| self.kinds.contains(&t.kind))
            .cloned()
            .collect()
    }

    /// What the kernel tables become when `ruleset` has `tables` (its [`Self::tables_of`];
    /// `None`: it is removed) at `priority` and the other rulesets of `active` stay; `None`
    /// when no configured table's text changes.
    ///
    /// Errors: [`Error::KernelTables`] when two rulesets declare one user chain of a kernel
    /// table, or different policies of one builtin chain.
    pub fn next(
        &self,
        ruleset: &str,
        change: Option<(i32, Vec<Table>)>,
        active: &BTreeMap<String, Arc<Ruleset>>,
    ) -> Result<Option<Next>> {
        let before = active
            .get(ruleset)
            .is_some_and(|r| r.tables.iter().any(|t| self.kinds.contains(&t.kind)));
        let after = change.as_ref().is_some_and(|(_, t)| !t.is_empty());
        if !before && !after {
            return Ok(None);
        }
        // Every ruleset's contribution, in the engine's order (priority, then name).
        let mut order: Vec<(i32, &str, &[Table])> = active
            .iter()
            .filter(|(name, _)| name.as_str() != ruleset)
            .map(|(name, r)| (r.priority, name.as_str(), r.tables.as_slice()))
            .collect();
        if let Some((priority, tables)) = &change {
            order.push((*priority, ruleset, tables.as_slice()));
        }
        order.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let texts = self.merge(&order)?;
        let applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        let drift = self.drift.lock().unwrap_or_else(PoisonError::into_inner);
        // The families whose text changes, or that the last check found drifted.
        let families: Vec<Family> = FAMILIES
            .into_iter()
            .filter(|&f| {
                self.kinds.iter().any(|&k| {
                    applied.get(&(f, k)) != texts.get(&(f, k))
                        || drift.get(&(f, k)).is_some_and(|d| d.drift)
                })
            })
            .collect();
        Ok((!families.is_empty()).then_some(Next { texts, families }))
    }

    /// The canonical text of every configured (family, table), merged over `order`.
    fn merge(
        &self,
        order: &[(i32, &str, &[Table])],
    ) -> Result<BTreeMap<(Family, TableKind), String>> {
        let mut texts = BTreeMap::new();
        for family in FAMILIES {
            for &kind in &self.kinds {
                let mut merged = Table {
                    family,
                    kind,
                    chains: kind
                        .builtin_hooks()
                        .iter()
                        .map(|h| Chain {
                            name: h.chain_name().to_string(),
                            policy: Some(Policy::Accept),
                            counters: Default::default(),
                            rules: Default::default(),
                            location: Default::default(),
                            nft_hook: None,
                        })
                        .collect(),
                    location: Default::default(),
                };
                // Who declared each chain (user chains) or set each policy (builtin).
                let mut owner: BTreeMap<String, &str> = BTreeMap::new();
                for (_, name, tables) in order {
                    let Some(t) = tables.iter().find(|t| t.family == family && t.kind == kind)
                    else {
                        continue;
                    };
                    for c in &t.chains {
                        match merged.chains.iter_mut().find(|m| m.name == c.name) {
                            Some(m) if c.policy.is_some() && m.policy.is_some() => {
                                if c.policy != Some(Policy::Accept) {
                                    if let Some(other) = owner.get(&c.name)
                                        && m.policy != c.policy
                                    {
                                        return Err(conflict(
                                            family,
                                            kind,
                                            &c.name,
                                            other,
                                            name,
                                            "set different policies of",
                                        ));
                                    }
                                    m.policy = c.policy;
                                    owner.insert(c.name.clone(), name);
                                }
                                let end = m.rules.len();
                                m.rules.splice(end..end, c.rules.iter().cloned());
                            }
                            Some(_) => {
                                let other = owner.get(&c.name).copied().unwrap_or("?");
                                return Err(conflict(
                                    family,
                                    kind,
                                    &c.name,
                                    other,
                                    name,
                                    "both declare",
                                ));
                            }
                            None => {
                                merged.chains.push(c.clone());
                                owner.insert(c.name.clone(), name);
                            }
                        }
                    }
                }
                texts.insert(
                    (family, kind),
                    restore::print_table(&merged, &PrintOptions::default()),
                );
            }
        }
        Ok(texts)
    }

    /// Writes `next` to the kernel (the families whose text changed, IPv4 first); returns
    /// what to write to put the previous texts back.
    ///
    /// Errors: [`Error::KernelTables`] with the program's message and the refused line;
    /// nothing is changed then (an IPv4 text already written is put back).
    pub async fn apply(&self, next: Next) -> Result<Undo> {
        let _running = self.running.lock().await;
        let previous = self
            .applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut written = Vec::new();
        for &family in &next.families {
            if let Err(e) = self.write(family, &next.texts).await {
                // Put back the families already written (best effort: said on error).
                for &f in &written {
                    if !previous.is_empty()
                        && let Err(back) = self.write(f, &previous).await
                    {
                        tracing::error!(family = ?f, error = %back, "putting the previous kernel tables back failed");
                    }
                }
                return Err(e);
            }
            written.push(family);
        }
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        let mut drift = self.drift.lock().unwrap_or_else(PoisonError::into_inner);
        for (&key, text) in &next.texts {
            if next.families.contains(&key.0) {
                applied.insert(key, text.clone());
                // Just written: what the next check compares against.
                if let Some(d) = drift.get_mut(&key) {
                    d.drift = false;
                    d.detail.clear();
                }
            }
        }
        drop((applied, drift));
        Ok(Undo(Next {
            texts: previous,
            families: next.families,
        }))
    }

    /// Puts back what [`KernelTables::apply`] replaced (after a publish failed); an error is
    /// logged and shows as drift.
    pub async fn undo(&self, undo: Undo) {
        if undo.0.texts.is_empty() {
            return;
        }
        if let Err(e) = self.apply(undo.0).await {
            tracing::error!(error = %e, "putting the previous kernel tables back failed");
        }
    }

    /// Writes every configured table of `rulesets` (the active ones) to the kernel, changed
    /// or not: at start.
    ///
    /// Errors: as [`KernelTables::apply`], and [`Error::KernelTables`] for conflicts.
    pub async fn sync(&self, rulesets: &BTreeMap<String, Arc<Ruleset>>) -> Result<()> {
        let mut order: Vec<(i32, &str, &[Table])> = rulesets
            .iter()
            .map(|(n, r)| (r.priority, n.as_str(), r.tables.as_slice()))
            .collect();
        order.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let texts = self.merge(&order)?;
        self.apply(Next {
            texts,
            families: FAMILIES.to_vec(),
        })
        .await
        .map(drop)
    }

    /// One family's tables, from `texts`, through the restore program.
    async fn write(
        &self,
        family: Family,
        texts: &BTreeMap<(Family, TableKind), String>,
    ) -> Result<()> {
        let input: String = self
            .kinds
            .iter()
            .filter_map(|&k| texts.get(&(family, k)))
            .map(String::as_str)
            .collect();
        let program = &self.tools(family).restore;
        let out = run(program, &[], Some(&input)).await?;
        if out.status_ok {
            return Ok(());
        }
        let mut message = format!("{} refused the tables: {}", program.display(), out.stderr);
        // "Error occurred at line: N" (legacy) or "line N: ..." (nft) names a line of our
        // input: show it.
        if let Some(line) = refused_line(&out.stderr).and_then(|n| input.lines().nth(n - 1)) {
            message.push_str(&format!(" (line: {line})"));
        }
        Err(Error::KernelTables(message))
    }

    /// Compares each configured table of the kernel with what vallumd last wrote (see the
    /// module docs) and records the result for the metric; returns it.
    pub async fn check(&self) -> Vec<TableDrift> {
        let _running = self.running.lock().await;
        let applied = self
            .applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut report = Vec::new();
        for family in FAMILIES {
            for &kind in &self.kinds {
                let Some(ours) = applied.get(&(family, kind)) else {
                    continue;
                };
                let detail = match self.kernel_text(family, kind).await {
                    Ok(theirs) => differs(ours, &theirs),
                    Err(why) => Some(why),
                };
                report.push(TableDrift {
                    family,
                    table: kind,
                    drift: detail.is_some(),
                    detail: detail.unwrap_or_default(),
                    checked_at: self.clock.unix_ns(),
                });
            }
        }
        let mut drift = self.drift.lock().unwrap_or_else(PoisonError::into_inner);
        for d in &report {
            if d.drift {
                tracing::warn!(family = ?d.family, table = %d.table, detail = %d.detail, "kernel table drift");
            }
            drift.insert((d.family, d.table), d.clone());
        }
        report
    }

    /// The kernel's `table` of `family`, canonical (parsed and printed, counters zero).
    async fn kernel_text(
        &self,
        family: Family,
        kind: TableKind,
    ) -> std::result::Result<String, String> {
        let program = &self.tools(family).save;
        let out = run(program, &["-t", kind.name()], None)
            .await
            .map_err(|e| e.to_string())?;
        if !out.status_ok {
            return Err(format!("{} failed: {}", program.display(), out.stderr));
        }
        let opts = ParseOptions {
            family,
            ..ParseOptions::default()
        };
        let parsed = restore::parse(&out.stdout, &opts).map_err(|e| {
            format!(
                "the kernel's {kind} table does not parse here: {}",
                e.to_string().lines().next().unwrap_or_default()
            )
        })?;
        let table = parsed
            .tables
            .iter()
            .find(|t| t.kind == kind)
            .ok_or_else(|| format!("{} printed no {kind} table", program.display()))?;
        Ok(restore::print_table(table, &PrintOptions::default()))
    }

    /// Registers `vallum_kernel_tables_drift{family,table}` (1: drift, 0: in sync) with
    /// `metrics`.
    pub fn observe(&self, metrics: &crate::telemetry::metrics::Metrics) {
        observe_drift(metrics, self.drift.clone());
    }

    /// Runs [`KernelTables::check`] every `--kernel-tables-check-interval` until the task is
    /// aborted.
    pub fn spawn_checks(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(me.interval);
            loop {
                tick.tick().await;
                me.check().await;
            }
        })
    }
}

/// `ipv4` or `ipv6`, as the metric's and the status's label.
pub fn family_name(f: Family) -> &'static str {
    match f {
        Family::Ipv4 => "ipv4",
        Family::Ipv6 => "ipv6",
    }
}

fn conflict(family: Family, kind: TableKind, chain: &str, a: &str, b: &str, what: &str) -> Error {
    Error::KernelTables(format!(
        "rulesets {a} and {b} {what} chain {chain} of the {} {kind} table, which the kernel \
         has once (--kernel-tables): rename the chain in one of them",
        family_name(family)
    ))
}
/// `None` when `ours` and `theirs` are the same text, else what differs: the kernel's lines
/// vallumd did not write ("added in the kernel", e.g. a rule added by hand) and vallumd's lines
/// the kernel lacks ("missing from the kernel"), each as a multiset of lines (a line written
/// twice counts twice), at most [`DRIFT_LINES`] of each and how many more; when both hold the
/// same lines in another order, the first line out of place.
fn differs(ours: &str, theirs: &str) -> Option<String> {
    if ours == theirs {
        return None;
    }
    let mut count: HashMap<&str, i64> = HashMap::new();
    for l in ours.lines() {
        *count.entry(l).or_default() += 1;
    }
    for l in theirs.lines() {
        *count.entry(l).or_default() -= 1;
    }
    // In the order each side prints them.
    let mut left = count.clone();
    let missing: Vec<&str> = ours.lines().filter(|l| take_one(&mut left, l, 1)).collect();
    let added: Vec<&str> = theirs
        .lines()
        .filter(|l| take_one(&mut left, l, -1))
        .collect();
    let list = |what: &str, lines: &[&str]| {
        let mut s = format!("{what} ({}): ", lines.len());
        let shown: Vec<String> = lines
            .iter()
            .take(DRIFT_LINES)
            .map(|l| format!("{l:?}"))
            .collect();
        s.push_str(&shown.join(", "));
        if lines.len() > DRIFT_LINES {
            s.push_str(&format!(" and {} more", lines.len() - DRIFT_LINES));
        }
        s
    };
    let mut parts = Vec::new();
    if !added.is_empty() {
        parts.push(list("added in the kernel", &added));
    }
    if !missing.is_empty() {
        parts.push(list("missing from the kernel", &missing));
    }
    if parts.is_empty() {
        let (n, l) = ours
            .lines()
            .zip(theirs.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map_or((0, ""), |(n, (a, _))| (n + 1, a));
        return Some(format!(
            "the same lines in another order: vallumd's line {n} {l:?} is elsewhere in the kernel"
        ));
    }
    Some(parts.join("; "))
}

/// Lines of each kind a drift detail lists ([`differs`]).
const DRIFT_LINES: usize = 5;

/// Whether `line` is one more on the side `sign` stands for (1: vallumd's, -1: the kernel's)
/// in `left`, which it then counts down.
fn take_one(left: &mut HashMap<&str, i64>, line: &str, sign: i64) -> bool {
    match left.get_mut(line) {
        Some(n) if *n * sign > 0 => {
            *n -= sign;
            true
        }
        _ => false,
    }
}

/// The 1-based input line a restore program's message names: `line: N` (legacy's "Error
/// occurred at line: N") or `line N:` (nft's "line N: RULE_APPEND failed").
fn refused_line(stderr: &str) -> Option<usize> {
    stderr.match_indices("line").find_map(|(i, _)| {
        let rest = stderr[i + 4..].trim_start_matches(':').trim_start();
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok().filter(|&n: &usize| n > 0)
    })
}

/// A finished kernel program.
pub(crate) struct Output {
    pub(crate) status_ok: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `program args` with `input` on stdin (none: `/dev/null`), at most [`TOOL_TIMEOUT`].
pub(crate) async fn run(program: &Path, args: &[&str], input: Option<&str>) -> Result<Output> {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::KernelTables(format!("{}: {e}", program.display())))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        // A program that exits early closes the pipe: its exit status says why.
        let _ = stdin.write_all(text.as_bytes()).await;
        drop(stdin);
    }
    let out = tokio::time::timeout(TOOL_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| {
            Error::KernelTables(format!(
                "{} did not finish in {} s",
                program.display(),
                TOOL_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| Error::KernelTables(format!("{}: {e}", program.display())))?;
    Ok(Output {
        status_ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// The drift map of [`KernelTables`] per (family, table), as its metric's callback reads it.
pub(crate) type DriftMap = Arc<Mutex<BTreeMap<(Family, TableKind), TableDrift>>>;

/// Registers `vallum_kernel_tables_drift{family,table}` (1: drift, 0: in sync), read from
/// `drift` at scrape time, with `metrics` ([`KernelTables::observe`]; the metric reference's
/// test feeds it a map of its own).
pub(crate) fn observe_drift(metrics: &crate::telemetry::metrics::Metrics, drift: DriftMap) {
    let gauge = metrics
        .meter()
        .u64_observable_gauge("vallum_kernel_tables_drift")
        .with_description(
            "1 when the kernel's copy of a table vallumd hands to it (--kernel-tables) \
             differs from vallumd's, 0 when they are the same (checked periodically and on \
             GetStatus).",
        )
        .with_callback(move |obs| {
            let map = drift.lock().unwrap_or_else(PoisonError::into_inner);
            for d in map.values() {
                obs.observe(
                    u64::from(d.drift),
                    &[
                        opentelemetry::KeyValue::new("family", family_name(d.family)),
                        opentelemetry::KeyValue::new("table", d.table.name()),
                    ],
                );
            }
        })
        .build();
    metrics.keep(Box::new(gauge));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ruleset(name: &str, priority: i32, text: &str) -> Arc<Ruleset> {
        let mut r = restore::parse_ruleset(name, text, &ParseOptions::default()).expect("parses");
        r.priority = priority;
        Arc::new(r)
    }

    fn kernel(kinds: &[TableKind]) -> KernelTables {
        let restore = Path::new("/x/iptables-nft-restore");
        KernelTables {
            kinds: kinds.to_vec(),
            tools: [
                tools_of(restore, Family::Ipv4).unwrap(),
                tools_of(restore, Family::Ipv6).unwrap(),
            ],
            interval: Duration::from_secs(1),
            applied: Mutex::new(BTreeMap::new()),
            running: tokio::sync::Mutex::new(()),
            drift: Arc::default(),
            clock: crate::clock::Clock::system(),
        }
    }

    #[test]
    fn flag_takes_only_tables_not_enforced() {
        assert_eq!(parse_kernel_table("nat"), Ok(TableKind::Nat));
        assert_eq!(parse_kernel_table("mangle"), Ok(TableKind::Mangle));
        for bad in ["filter", "raw", "natt", ""] {
            assert!(parse_kernel_table(bad).is_err(), "{bad}");
        }
        let c = crate::config::Config::from_args(["vallumd", "--kernel-tables", "nat,mangle"])
            .expect("parses");
        assert_eq!(
            c.kernel_tables.kernel_tables,
            [TableKind::Nat, TableKind::Mangle]
        );
        assert!(
            crate::config::Config::from_args(["vallumd", "--kernel-tables", "filter"]).is_err()
        );
        assert!(
            KernelTables::new(
                &crate::config::Config::default().kernel_tables,
                crate::clock::Clock::system(),
            )
            .expect("none")
            .is_none()
        );
    }

    #[test]
    fn tool_names() {
        let t = tools_of(Path::new("/usr/sbin/iptables-nft-restore"), Family::Ipv6).unwrap();
        assert_eq!(t.restore, Path::new("/usr/sbin/ip6tables-nft-restore"));
        assert_eq!(t.save, Path::new("/usr/sbin/ip6tables-nft-save"));
        let t = tools_of(Path::new("iptables-legacy-restore"), Family::Ipv4).unwrap();
        assert_eq!(t.save, Path::new("iptables-legacy-save"));
        assert!(tools_of(Path::new("iptables-nft"), Family::Ipv4).is_err());
        assert!(tools_of(Path::new("nft-restore"), Family::Ipv4).is_err());
    }

    const DOCKER: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        :POSTROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n\
        -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
        -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\nCOMMIT\n\
        *filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
    const KUBE: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
        :KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n\
        -A POSTROUTING -j MASQUERADE\nCOMMIT\n";

    #[test]
    fn merge_in_engine_order_and_refuse_clashes() {
        let k = kernel(&[TableKind::Nat]);
        let mut active = BTreeMap::new();
        active.insert("kube".to_string(), ruleset("kube", 10, KUBE));
        let docker = ruleset("docker", 0, DOCKER);
        let next = k
            .next("docker", Some((0, k.tables_of(&docker))), &active)
            .expect("merges")
            .expect("changes");
        let v4 = &next.texts[&(Family::Ipv4, TableKind::Nat)];
        // docker (priority 0) before kube (10) in each builtin chain; user chains sorted.
        assert_eq!(
            v4,
            "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
             :POSTROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n:KUBE-SERVICES - [0:0]\n\
             -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
             -A PREROUTING -j KUBE-SERVICES\n\
             -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\n\
             -A POSTROUTING -j MASQUERADE\nCOMMIT\n"
        );
        // IPv6 nat is empty but written: vallumd owns the kernel's copy.
        assert!(next.families.contains(&Family::Ipv6));
        assert!(!next.texts[&(Family::Ipv6, TableKind::Nat)].contains("-A "));
        // Filter is never in it.
        assert!(next.texts.keys().all(|(_, t)| *t == TableKind::Nat));
        // A filter-only ruleset changes nothing in the kernel.
        let filter = ruleset("f", 0, "*filter\n:INPUT DROP [0:0]\nCOMMIT\n");
        assert!(
            k.next("f", Some((0, k.tables_of(&filter))), &active)
                .unwrap()
                .is_none()
        );
        // Two rulesets declaring one user chain cannot share the kernel's one nat table.
        let clash = ruleset("other", 5, "*nat\n:DOCKER - [0:0]\nCOMMIT\n");
        active.insert("docker".to_string(), docker);
        let e = k
            .next("other", Some((5, k.tables_of(&clash))), &active)
            .expect_err("clash");
        assert!(
            e.to_string()
                .contains("docker and other both declare chain DOCKER"),
            "{e}"
        );
        assert_eq!(e.reason().info().name, "KERNEL_TABLES_REFUSED");
    }

    #[test]
    fn the_refused_line() {
        let nft = "iptables-nft-restore v1.8.9 (nf_tables): \nline 4: RULE_APPEND failed";
        assert_eq!(refused_line(nft), Some(4));
        let legacy = "iptables-restore: Couldn't load match `x'\n\nError occurred at line: 12";
        assert_eq!(refused_line(legacy), Some(12));
        assert_eq!(refused_line("no number here"), None);
    }

    #[test]
    fn drift_says_what_was_added_and_what_is_missing() {
        assert_eq!(differs("a\nb\n", "a\nb\n"), None);
        let d = differs("a\nb\n", "a\nc\n").unwrap();
        assert_eq!(
            d,
            r#"added in the kernel (1): "c"; missing from the kernel (1): "b""#
        );
        // A rule added by hand above ours: only the addition, ours is not reported gone.
        let ours =
            "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -p tcp --dport 80 -j DNAT\nCOMMIT\n";
        let theirs = "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -s 10.9.9.9/32 -j ACCEPT\n\
                      -A PREROUTING -p tcp --dport 80 -j DNAT\nCOMMIT\n";
        let d = differs(ours, theirs).unwrap();
        assert_eq!(
            d,
            r#"added in the kernel (1): "-A PREROUTING -s 10.9.9.9/32 -j ACCEPT""#
        );
        let d = differs("a\nb\n", "b\na\n").unwrap();
        assert!(d.starts_with("the same lines in another order"), "{d}");
        // A line twice on one side counts twice; long lists are cut.
        let d = differs("a\n", "a\na\n").unwrap();
        assert_eq!(d, r#"added in the kernel (1): "a""#);
        let many: String = (0..8).map(|i| format!("x{i}\n")).collect();
        let d = differs("", &many).unwrap();
        assert!(d.ends_with(r#""x4" and 3 more"#), "{d}");
    }
}
