//! The read-only methods of `vallum.v1.RulesetService` (validate, get, list, diff, export,
//! watch), run by the one handler layer ([`crate::grpc::call::read`]), and the revision diff.

use std::collections::{BTreeMap, HashMap};

use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tonic::{Request, Response, Status};
use vallum_engine::model::{Counters, Family, Ruleset, TableKind};
use vallum_engine::nft;
use vallum_engine::restore::{PrintOptions, print_rule_spec};
use vallum_proto::v1 as pb;

use super::super::paging;
use super::{LIST_REVISIONS, LIST_RULESETS, RulesetApi, Stored, WatchStream};
use crate::control::content::{self, Content};
use crate::error::Error;
use crate::grpc::convert;

/// `ValidateRuleset`: parses and validates a source, stores nothing.
pub(super) async fn validate_ruleset(
    api: &RulesetApi,
    request: Request<pb::ValidateRulesetRequest>,
) -> Result<Response<pb::ValidateRulesetResponse>, Status> {
    let r = request.into_inner();
    let name = if r.ruleset.is_empty() {
        "validate".to_string()
    } else {
        convert::ruleset_id("ruleset", &r.ruleset)?
    };
    let (checked, _) = api
        .check(&name, 0, r.source.as_ref(), "", &mut Stored::default())
        .await?;
    let checked = api.state.pipeline.validate(checked).await?;
    Ok(Response::new(pb::ValidateRulesetResponse {
        valid: checked.valid(),
        violations: checked.findings.iter().map(convert::violation).collect(),
        rule_count: u32::try_from(checked.rule_count()).unwrap_or(u32::MAX),
    }))
}

/// `GetRuleset`: one ruleset's row.
pub(super) async fn get_ruleset(
    api: &RulesetApi,
    request: Request<pb::GetRulesetRequest>,
) -> Result<Response<pb::Ruleset>, Status> {
    let r = request.into_inner();
    let name = convert::ruleset_id("name", &r.name)?;
    let rs = api.state.pipeline.store().get_ruleset(&name).await?;
    let rs = rs.ok_or_else(|| Error::NotFound {
        kind: "ruleset",
        name: format!("rulesets/{name}"),
    })?;
    Ok(Response::new(convert::ruleset(&rs)))
}

/// `ListRulesets`: the rulesets by name, a page at a time ([`LIST_RULESETS`]).
pub(super) async fn list_rulesets(
    api: &RulesetApi,
    request: Request<pb::ListRulesetsRequest>,
) -> Result<Response<pb::ListRulesetsResponse>, Status> {
    let r = request.into_inner();
    let page = LIST_RULESETS.page(r.page_size, &r.page_token, "")?;
    let after = page.cursor.unwrap_or_default();
    let rows = api
        .state
        .pipeline
        .store()
        .list_rulesets_after(&after, page.size as u32 + 1)
        .await?;
    let (rulesets, more) = paging::fill(rows.iter().map(convert::ruleset), page.size);
    let next_page_token = match rulesets.len().checked_sub(1) {
        Some(last) if more => LIST_RULESETS.token("", &rows[last].name),
        _ => String::new(),
    };
    Ok(Response::new(pb::ListRulesetsResponse {
        rulesets,
        next_page_token,
    }))
}

/// `ListRevisions`: a ruleset's revisions by number, a page at a time ([`LIST_REVISIONS`]).
pub(super) async fn list_revisions(
    api: &RulesetApi,
    request: Request<pb::ListRevisionsRequest>,
) -> Result<Response<pb::ListRevisionsResponse>, Status> {
    let r = request.into_inner();
    let name = convert::ruleset_id("ruleset", &r.ruleset)?;
    let page = LIST_REVISIONS.page(r.page_size, &r.page_token, &name)?;
    let after: u64 = match page.cursor {
        None => 0,
        Some(c) => c
            .parse()
            .map_err(|_| Error::invalid("page_token", "not a page token of ListRevisions"))?,
    };
    let store = api.state.pipeline.store();
    if store.get_ruleset(&name).await?.is_none() {
        return Err(Error::NotFound {
            kind: "ruleset",
            name: format!("rulesets/{name}"),
        }
        .into());
    }
    let revs = store
        .list_revisions(&name, after, page.size as u32 + 1)
        .await?;
    let (revisions, more) = paging::fill(
        revs.iter().map(|r| convert::revision(r, false, &[])),
        page.size,
    );
    let next_page_token = match revisions.last() {
        Some(last) if more => LIST_REVISIONS.token(&name, &last.number.to_string()),
        _ => String::new(),
    };
    Ok(Response::new(pb::ListRevisionsResponse {
        next_page_token,
        revisions,
    }))
}

/// `GetRevision`: one revision with its content.
pub(super) async fn get_revision(
    api: &RulesetApi,
    request: Request<pb::GetRevisionRequest>,
) -> Result<Response<pb::Revision>, Status> {
    let r = request.into_inner();
    let (name, n) = convert::revision_name("name", &r.name)?;
    let rev = api.state.pipeline.store().get_revision(&name, n).await?;
    let rev = rev.ok_or_else(|| Error::NotFound {
        kind: "revision",
        name: r.name.clone(),
    })?;
    Ok(Response::new(convert::revision(&rev, true, &[])))
}

/// `DiffRevisions`: per chain, the rules added, removed and moved between two revisions
/// of one ruleset ([`diff`]).
pub(super) async fn diff_revisions(
    api: &RulesetApi,
    request: Request<pb::DiffRevisionsRequest>,
) -> Result<Response<pb::DiffRevisionsResponse>, Status> {
    let r = request.into_inner();
    let (a, an) = convert::revision_name("base", &r.base)?;
    let (b, bn) = convert::revision_name("target", &r.target)?;
    if a != b {
        return Err(
            Error::invalid("target", "both revisions must belong to the same ruleset").into(),
        );
    }
    let store = api.state.pipeline.store();
    let load = |n: u64, field: &'static str| {
        let a = a.clone();
        async move {
            let rev = store
                .get_revision(&a, n)
                .await?
                .ok_or_else(|| Error::NotFound {
                    kind: "revision",
                    name: convert::revision_resource(&a, n),
                });
            let _ = field;
            rev.map(|r| r.content)
        }
    };
    let from = load(an, "base").await?;
    let to = load(bn, "target").await?;
    let chains = match (from.is_nft(), to.is_nft()) {
        (false, false) => diff(&from.to_ruleset(&a, 0)?, &to.to_ruleset(&a, 0)?),
        (true, true) => diff_nft(
            &content::nft::parse_stored(from.v4(), &a)?,
            &content::nft::parse_stored(to.v4(), &a)?,
        ),
        _ => {
            return Err(Error::invalid(
                "target",
                "one revision is an nft ruleset and the other an iptables ruleset: a diff compares rules of one syntax (export both to see them)",
            )
            .into());
        }
    };
    Ok(Response::new(pb::DiffRevisionsResponse { chains }))
}

/// `ExportRevision`: a revision as `iptables-save` text or JSON, with the live counters
/// when it is the active one and they are asked for.
pub(super) async fn export_revision(
    api: &RulesetApi,
    request: Request<pb::ExportRevisionRequest>,
) -> Result<Response<pb::ExportRevisionResponse>, Status> {
    let r = request.into_inner();
    let (name, n) = convert::revision_name("name", &r.name)?;
    let rev = api.state.pipeline.store().get_revision(&name, n).await?;
    let rev = rev.ok_or_else(|| Error::NotFound {
        kind: "revision",
        name: r.name.clone(),
    })?;
    let format = pb::ExportFormat::try_from(r.format)
        .map_err(|_| Error::invalid("format", "unknown export format"))?;
    if rev.content.is_nft() {
        return Ok(Response::new(export_nft(&name, &rev.content, format)?));
    }
    let mut model = rev.content.to_ruleset(&name, 0)?;
    let live = r.counters && api.state.pipeline.active().get(&name).map(|x| x.revision) == Some(n);
    if live {
        fill_counters(&mut model, &api.state.pipeline.engine().counters());
    }
    let (content, content_type) = match format {
        pb::ExportFormat::Unspecified | pb::ExportFormat::IptablesSave => {
            let c = Content::from_tables_with(
                &model.tables,
                &PrintOptions {
                    counters: r.counters,
                },
            );
            (c.combined(), "text/plain")
        }
        pb::ExportFormat::Json => (json_view(&model, n, &rev.digest, live), "application/json"),
        pb::ExportFormat::Nft | pb::ExportFormat::NftJson => {
            return Err(Error::invalid(
                "format",
                "this revision is an iptables ruleset: export it as iptables-save or JSON (nft and nft-json are the forms of rulesets sent as nft)",
            )
            .into());
        }
    };
    Ok(Response::new(pb::ExportRevisionResponse {
        content,
        content_type: content_type.into(),
    }))
}

/// The export of an nft revision's `content` (its canonical listing): the listing itself
/// (`format` unspecified or NFT) or nft JSON (NFT_JSON, [`vallum_engine::nft::to_json`]).
///
/// Errors: INVALID_ARGUMENT at `format` for the iptables forms; [`Error::StoreCorrupt`]
/// when the stored listing no longer parses.
fn export_nft(
    name: &str,
    content: &Content,
    format: pb::ExportFormat,
) -> Result<pb::ExportRevisionResponse, Error> {
    let (content, content_type) = match format {
        pb::ExportFormat::Unspecified | pb::ExportFormat::Nft => {
            (content.v4().to_string(), "text/plain")
        }
        pb::ExportFormat::NftJson => {
            let rs = crate::control::content::nft::parse_stored(content.v4(), name)?;
            let j = vallum_engine::nft::to_json(&rs);
            (format!("{j}\n"), "application/json")
        }
        pb::ExportFormat::IptablesSave | pb::ExportFormat::Json => {
            return Err(Error::invalid(
                "format",
                "this revision is an nft ruleset: export it as nft or nft-json",
            ));
        }
    };
    Ok(pb::ExportRevisionResponse {
        content,
        content_type: content_type.into(),
    })
}

/// `WatchCommits`: the commit events (replayed after `start_after`, then live); a watcher
/// that lagged gets DATA_LOSS naming where to resume.
pub(super) async fn watch_commits(
    api: &RulesetApi,
    request: Request<pb::WatchCommitsRequest>,
) -> Result<Response<WatchStream>, Status> {
    let r = request.into_inner();
    let filter = if r.ruleset.is_empty() {
        None
    } else {
        Some(convert::ruleset_id("ruleset", &r.ruleset)?)
    };
    let (replay, rx) = match r.start_after {
        0 => (Vec::new(), api.state.pipeline.subscribe()),
        n => api.state.pipeline.resume_events(n)?,
    };
    // The last sequence this watcher was sent (or skipped by the filter): where a
    // watcher that lagged resumes.
    let mut last = replay.last().map_or(r.start_after, |e| e.sequence);
    let wanted = move |e: &crate::control::pipeline::CommitEvent| {
        filter.as_ref().is_none_or(|f| *f == e.ruleset)
    };
    let replay: Vec<_> = replay.into_iter().filter(&wanted).collect();
    let live = BroadcastStream::new(rx).filter_map(move |e| match e {
        Ok(e) => {
            last = e.sequence;
            wanted(&e).then(|| Ok(convert::commit_event(&e)))
        }
        // A slow watcher lost events: tell it, rather than silently skipping.
        Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
            Some(Err(Status::data_loss(format!(
                "watcher lagged behind; {n} commit events were dropped: watch again with start_after {last}"
            ))))
        }
    });
    let stream =
        tokio_stream::iter(replay.into_iter().map(|e| Ok(convert::commit_event(&e)))).chain(live);
    Ok(Response::new(Box::pin(stream)))
}

fn fill_counters(model: &mut Ruleset, counters: &[vallum_engine::snapshot::SlotCounters]) {
    for c in counters.iter().filter(|c| *c.ruleset == *model.name) {
        let Some(t) = model
            .tables
            .iter_mut()
            .find(|t| t.family == c.family && t.kind == c.table)
        else {
            continue;
        };
        let Some(ch) = t.chains.iter_mut().find(|ch| *ch.name == *c.chain) else {
            continue;
        };
        let v = Counters {
            packets: c.packets,
            bytes: c.bytes,
        };
        match c.rule {
            Some(n) => {
                if let Some(rule) = usize::try_from(n)
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|i| ch.rules.get_mut(i))
                {
                    rule.counters = Some(v);
                }
            }
            None => ch.counters = v,
        }
    }
}

fn json_view(model: &Ruleset, number: u64, digest: &str, counters: bool) -> String {
    let tables: Vec<serde_json::Value> = model
        .tables
        .iter()
        .map(|t| {
            let chains: Vec<serde_json::Value> = t
                .chains
                .iter()
                .map(|c| {
                    let rules: Vec<serde_json::Value> = c
                        .rules
                        .iter()
                        .map(|r| {
                            let mut v = serde_json::json!({ "rule": print_rule_spec(r, t.family) });
                            if let (true, Some(k)) = (counters, r.counters) {
                                v["packets"] = k.packets.into();
                                v["bytes"] = k.bytes.into();
                            }
                            v
                        })
                        .collect();
                    serde_json::json!({
                        "name": c.name,
                        "policy": c.policy.map(|p| format!("{p:?}").to_uppercase()),
                        "rules": rules,
                    })
                })
                .collect();
            serde_json::json!({
                "family": match t.family { Family::Ipv4 => "ipv4", Family::Ipv6 => "ipv6" },
                "table": t.kind.name(),
                "chains": chains,
            })
        })
        .collect();
    let v = serde_json::json!({
        "ruleset": model.name,
        "revision": number,
        "digest": digest,
        "tables": tables,
    });
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| String::from("{}"))
}

/// A chain's place as `ChainDiff` names it: family, table, chain.
type ChainKey = (pb::Family, String, String);

/// A chain's key, canonical rule texts and policy name.
type ChainEntry = (ChainKey, Vec<String>, Option<String>);

/// The chains of an iptables ruleset, in family, table-kind and name order.
fn chains(rs: &Ruleset) -> BTreeMap<(u8, u8, String), ChainEntry> {
    let mut out = BTreeMap::new();
    for t in &rs.tables {
        for c in &t.chains {
            let fam = match t.family {
                Family::Ipv4 => 0,
                Family::Ipv6 => 1,
            };
            let kind = TableKind::ALL
                .iter()
                .position(|k| *k == t.kind)
                .unwrap_or(0) as u8;
            out.insert(
                (fam, kind, c.name.clone()),
                (
                    (
                        convert::family_pb(t.family),
                        t.kind.name().to_string(),
                        c.name.clone(),
                    ),
                    c.rules
                        .iter()
                        .map(|r| print_rule_spec(r, t.family))
                        .collect(),
                    c.policy.map(|p| format!("{p:?}").to_uppercase()),
                ),
            );
        }
    }
    out
}

/// The chains of an nft ruleset, by table (`FAMILY NAME`, as nft names a table) and chain
/// name: rules as `nft list ruleset` lists them ([`nft::rule_text`]), a base chain's policy
/// as nft writes it (`accept`, `drop`). The family is IPV4 for `ip`, IPV6 for `ip6` and
/// unspecified for `inet` tables.
fn nft_chains(rs: &nft::Ruleset) -> BTreeMap<(String, String), ChainEntry> {
    let mut out = BTreeMap::new();
    for t in &rs.tables {
        let table = format!("{} {}", t.family.name(), t.name);
        let family = match t.family {
            nft::Family::Ip => pb::Family::Ipv4,
            nft::Family::Ip6 => pb::Family::Ipv6,
            nft::Family::Inet => pb::Family::Unspecified,
        };
        for c in &t.chains {
            out.insert(
                (table.clone(), c.name.clone()),
                (
                    (family, table.clone(), c.name.clone()),
                    c.rules
                        .iter()
                        .map(|r| nft::rule_text(t.family, r))
                        .collect(),
                    c.base.map(|b| match b.policy {
                        nft::Policy::Accept => "accept".to_string(),
                        nft::Policy::Drop => "drop".to_string(),
                    }),
                ),
            );
        }
    }
    out
}

/// Per chain: rules only in `to` (added), only in `from` (removed), and rules in both whose
/// order relative to the others changed (moved: those outside a longest common order).
/// Equal rule texts are paired by occurrence (the k-th copy with the k-th copy).
pub fn diff(from: &Ruleset, to: &Ruleset) -> Vec<pb::ChainDiff> {
    diff_chains(&chains(from), &chains(to))
}

/// As [`diff`] for two nft rulesets: chains by table (`inet filter`) and name, rules as
/// `nft list ruleset` lists them.
pub fn diff_nft(from: &nft::Ruleset, to: &nft::Ruleset) -> Vec<pb::ChainDiff> {
    diff_chains(&nft_chains(from), &nft_chains(to))
}

/// The diff of two rulesets' chains, in key order ([`diff`]).
fn diff_chains<K: Ord + Clone>(
    a: &BTreeMap<K, ChainEntry>,
    b: &BTreeMap<K, ChainEntry>,
) -> Vec<pb::ChainDiff> {
    let mut keys: Vec<_> = a.keys().chain(b.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    let empty = Vec::new();
    let mut out = Vec::new();
    for k in keys {
        let ea = a.get(&k);
        let eb = b.get(&k);
        let key = ea.or(eb).map(|e| e.0.clone());
        let Some((family, table, chain)) = key else {
            continue;
        };
        let old = ea.map_or(&empty, |e| &e.1);
        let new = eb.map_or(&empty, |e| &e.1);
        // Pair occurrences.
        let mut positions: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, r) in new.iter().enumerate() {
            positions.entry(r.as_str()).or_default().push(i);
        }
        for v in positions.values_mut() {
            v.reverse();
        }
        let mut pairs = Vec::new(); // (old index, new index)
        let mut removed = Vec::new();
        for (i, r) in old.iter().enumerate() {
            match positions.get_mut(r.as_str()).and_then(Vec::pop) {
                Some(j) => pairs.push((i, j)),
                None => removed.push(r.clone()),
            }
        }
        let paired_new: std::collections::HashSet<usize> = pairs.iter().map(|p| p.1).collect();
        let added: Vec<String> = new
            .iter()
            .enumerate()
            .filter(|(j, _)| !paired_new.contains(j))
            .map(|(_, r)| r.clone())
            .collect();
        // Longest increasing subsequence of new indices, in old order: those stay; others moved.
        let keep = lis(&pairs.iter().map(|p| p.1).collect::<Vec<_>>());
        let moved: Vec<pb::RuleMove> = pairs
            .iter()
            .enumerate()
            .filter(|(idx, _)| !keep.contains(idx))
            .map(|(_, &(i, j))| pb::RuleMove {
                rule: old[i].clone(),
                from_position: (i + 1) as u32,
                to_position: (j + 1) as u32,
            })
            .collect();
        let pa = ea.and_then(|e| e.2.clone());
        let pb_ = eb.and_then(|e| e.2.clone());
        let policy_change = if pa != pb_ && pa.is_some() && pb_.is_some() {
            format!("{} -> {}", pa.unwrap_or_default(), pb_.unwrap_or_default())
        } else {
            String::new()
        };
        if added.is_empty()
            && removed.is_empty()
            && moved.is_empty()
            && policy_change.is_empty()
            && ea.is_some() == eb.is_some()
        {
            continue;
        }
        out.push(pb::ChainDiff {
            family: family as i32,
            table,
            chain,
            added,
            removed,
            moved,
            policy_change,
        });
    }
    out
}

/// Indices (into `v`) of one longest strictly increasing subsequence.
fn lis(v: &[usize]) -> std::collections::HashSet<usize> {
    let mut tails: Vec<usize> = Vec::new(); // indices into v
    let mut prev = vec![usize::MAX; v.len()];
    for i in 0..v.len() {
        let pos = tails.partition_point(|&t| v[t] < v[i]);
        if pos > 0 {
            prev[i] = tails[pos - 1];
        }
        if pos == tails.len() {
            tails.push(i);
        } else {
            tails[pos] = i;
        }
    }
    let mut out = std::collections::HashSet::new();
    let mut cur = tails.last().copied();
    while let Some(i) = cur {
        out.insert(i);
        cur = (prev[i] != usize::MAX).then_some(prev[i]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vallum_engine::restore::{ParseOptions, parse_ruleset};

    #[test]
    fn diff_added_removed_moved() {
        let p = |t: &str| parse_ruleset("a", t, &ParseOptions::default()).unwrap();
        let a = p(
            "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -s 1.1.1.1/32 -j DROP\n-A INPUT -s 2.2.2.2/32 -j DROP\n-A INPUT -s 3.3.3.3/32 -j DROP\nCOMMIT\n",
        );
        let b = p(
            "*filter\n:INPUT DROP [0:0]\n-A INPUT -s 3.3.3.3/32 -j DROP\n-A INPUT -s 1.1.1.1/32 -j DROP\n-A INPUT -s 4.4.4.4/32 -j DROP\nCOMMIT\n",
        );
        let d = diff(&a, &b);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].added, vec!["-s 4.4.4.4/32 -j DROP"]);
        assert_eq!(d[0].removed, vec!["-s 2.2.2.2/32 -j DROP"]);
        assert_eq!(d[0].moved.len(), 1);
        assert_eq!(d[0].policy_change, "ACCEPT -> DROP");
    }
}
