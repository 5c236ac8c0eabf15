//! The checks of one rule's target: the table and hooks it may run in (REJECT, NOTRACK, CT,
//! as their kernel modules' `.table`/`.hooks`), its family, the protocol it needs, limits on
//! its values, and options the engine does not enforce. Commit path: allocates only the
//! messages, reads no clock, takes no lock.

use super::{TableCheck, ViolationKind, with_why};
use crate::model::{Family, Hook, RejectWith, Rule, TableKind, Target};

fn target_name(t: &Target) -> &'static str {
    match t {
        Target::Reject(_) => "REJECT",
        Target::Notrack => "NOTRACK",
        Target::Ct(_) => "CT",
        _ => "target",
    }
}

impl TableCheck<'_> {
    /// The violations of `r`'s target into `errs` and `warns`; `proto` is the rule's `-p`
    /// without `!`, `reach` the hooks that reach its chain (as `check_rule`).
    pub(super) fn check_target(
        &mut self,
        r: &Rule,
        proto: Option<u8>,
        reach: u8,
        errs: &mut Vec<ViolationKind>,
        warns: &mut Vec<ViolationKind>,
    ) {
        let table = self.table;
        let family = table.family;
        let enforced = table.kind.is_enforced();
        let reached = |h: Hook| reach & (1 << h.index()) != 0;
        match &r.target {
            Target::Reject(w) => {
                if !matches!(table.kind, TableKind::Filter | TableKind::Nft) {
                    errs.push(ViolationKind::TargetTable {
                        target: "REJECT",
                        allowed: TableKind::Filter,
                    });
                }
                // nft's reject also runs at PREROUTING (nft_reject_validate's hook mask).
                let nft = table.kind == TableKind::Nft;
                for h in [Hook::Prerouting, Hook::Postrouting] {
                    if reached(h) && !(nft && h == Hook::Prerouting) {
                        errs.push(ViolationKind::WrongHook {
                            what: "REJECT",
                            hook: h,
                        });
                    }
                }
                let v4_only = matches!(
                    w,
                    RejectWith::ProtoUnreachable
                        | RejectWith::NetProhibited
                        | RejectWith::HostProhibited
                );
                let v6_only = matches!(w, RejectWith::PolicyFail | RejectWith::RejectRoute);
                if (v4_only && family == Family::Ipv6) || (v6_only && family == Family::Ipv4) {
                    errs.push(ViolationKind::WrongFamily(format!("--reject-with {w:?}")));
                }
                if *w == RejectWith::TcpReset && proto != Some(6) {
                    errs.push(ViolationKind::NeedsProtocol {
                        ext: "REJECT --reject-with tcp-reset",
                        proto: "tcp",
                    });
                }
            }
            Target::Notrack | Target::Ct(_) => {
                let nft_notrack = table.kind == TableKind::Nft && r.target == Target::Notrack;
                if table.kind != TableKind::Raw && !nft_notrack {
                    errs.push(ViolationKind::TargetTable {
                        target: target_name(&r.target),
                        allowed: TableKind::Raw,
                    });
                }
                // With --notrack the kernel uses no other option (xt_ct_tg_check); without,
                // the zone is enforced (the tracker's key), --helper warns.
                if let Target::Ct(ct) = &r.target {
                    for o in ct.other.iter().filter(|_| enforced && !ct.notrack) {
                        if o.name == "--helper" {
                            let helper = o.args.first().cloned().unwrap_or_default();
                            warns.push(ViolationKind::CtHelperNotRun(helper));
                        } else {
                            let name = format!("CT {}", o.name);
                            errs.push(ViolationKind::Unsupported {
                                what: "target",
                                name: with_why(true, &name, &name),
                                table: table.kind,
                            });
                        }
                    }
                }
            }
            Target::Opaque(o) => {
                if enforced {
                    errs.push(ViolationKind::Unsupported {
                        what: "target",
                        name: o.name.clone(),
                        table: table.kind,
                    });
                }
            }
            Target::Log(l) => {
                if l.prefix
                    .as_ref()
                    .is_some_and(|p| p.len() > 29 || p.chars().any(char::is_control))
                {
                    errs.push(ViolationKind::TooLong {
                        what: "log prefix",
                        value: l.prefix.clone().unwrap_or_default(),
                        max: 29,
                    });
                }
                if let Some(level) = l.level.filter(|&lv| lv > 7) {
                    // xt_LOG's checkentry: "level %u >= 8".
                    errs.push(ViolationKind::BadValue {
                        what: "log level",
                        value: level.to_string(),
                        reason: "syslog levels are 0 to 7",
                    });
                }
            }
            Target::Nflog(n) => {
                if n.prefix
                    .as_ref()
                    .is_some_and(|p| p.len() > 63 || p.chars().any(char::is_control))
                {
                    errs.push(ViolationKind::TooLong {
                        what: "nflog prefix",
                        value: n.prefix.clone().unwrap_or_default(),
                        max: 63,
                    });
                }
                if enforced {
                    warns.push(ViolationKind::NflogNoConsumer(n.group));
                }
            }
            Target::Connmark(_) => {
                if table.kind == TableKind::Raw {
                    warns.push(ViolationKind::NoConntrackInRaw("-j CONNMARK"));
                }
            }
            Target::Vmap(v) => {
                if table.kind != TableKind::Nft {
                    errs.push(ViolationKind::Unsupported {
                        what: "target",
                        name: format!("vmap @{} outside an nft table", v.map),
                        table: table.kind,
                    });
                }
            }
            Target::None
            | Target::Accept
            | Target::Drop
            | Target::Return
            | Target::Mark(_)
            | Target::Jump(_)
            | Target::Goto(_) => {}
        }
    }
}
