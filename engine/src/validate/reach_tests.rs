//! [`ViolationKind::HookNotReached`]: a chain reached only from hooks the node never
//! evaluates is a warning at its first rule, through [`validate`] and [`validate_after`].

use std::sync::Arc;

use super::*;
use crate::restore::{ParseOptions, parse_ruleset};
use crate::sets::{IpSet, SetRegistry};

/// A registry with no set that says which hooks are evaluated.
struct Reach(Arc<ReachedHooks>);

impl SetRegistry for Reach {
    fn lookup(&self, _name: &str) -> Option<Arc<dyn IpSet>> {
        None
    }
    fn reached_hooks(&self) -> Option<Arc<ReachedHooks>> {
        Some(self.0.clone())
    }
}

const TEXT: &str = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    -A PREROUTING -p udp --dport 53 -j CT --notrack\n\
    -A OUTPUT -p udp --sport 53 -j CT --notrack\nCOMMIT\n\
    *filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:FWD - [0:0]\n\
    :UNUSED - [0:0]\n\
    -A INPUT -p tcp --dport 22 -j ACCEPT\n-A FORWARD -j FWD\n\
    -A FWD -d 10.0.0.2/32 -j ACCEPT\n-A FWD -d 10.0.0.3/32 -j ACCEPT\n\
    -A UNUSED -j ACCEPT\nCOMMIT\n";

fn unreached(v: &[Violation]) -> Vec<String> {
    v.iter()
        .filter(|v| matches!(v.kind, ViolationKind::HookNotReached { .. }))
        .map(|v| {
            assert_eq!(v.severity, Severity::Warning, "{v}");
            v.to_string()
        })
        .collect()
}

#[test]
fn chains_only_unsteered_hooks_reach_are_warned_at_their_first_rule() {
    let rs = parse_ruleset("host", TEXT, &ParseOptions::default()).unwrap();
    let only_input = Reach(Arc::new(ReachedHooks::delivered(
        &[Hook::Input],
        &[Hook::Input],
        "the packet source delivers every packet at INPUT",
    )));
    let got = unreached(&validate(&rs, Some(&only_input)));
    assert_eq!(
        got,
        [
            "5:1: warning: raw/OUTPUT#1: rules 1-1 of this chain (lines 5-5) are never \
             evaluated on this node: the chain is reached only from OUTPUT, and the packet \
             source delivers every packet at INPUT",
            "14:1: warning: filter/FORWARD#1: rules 1-1 of this chain (lines 14-14) are \
             never evaluated on this node: the chain is reached only from FORWARD, and the \
             packet source delivers every packet at INPUT",
            "15:1: warning: filter/FWD#1: rules 1-2 of this chain (lines 15-16) are never \
             evaluated on this node: the chain is reached only from FORWARD, and the packet \
             source delivers every packet at INPUT",
        ],
        "raw PREROUTING (run for INPUT-queued packets) and the unused chain are not warned"
    );
    // Incremental validation keeps the warnings of unchanged rules.
    let next = TEXT.replace("--dport 22", "--dport 2222");
    let rs2 = parse_ruleset("host", &next, &ParseOptions::default()).unwrap();
    let (after, _) = validate_after(&rs2, &rs, Some(&only_input));
    assert_eq!(unreached(&after), got);
    assert_eq!(after, validate(&rs2, Some(&only_input)));
}

#[test]
fn every_hook_steered_or_unknown_warns_nothing() {
    let rs = parse_ruleset("host", TEXT, &ParseOptions::default()).unwrap();
    let all = [Hook::Input, Hook::Forward, Hook::Output];
    let steered = Reach(Arc::new(ReachedHooks::delivered(&all, &all, "")));
    assert!(unreached(&validate(&rs, Some(&steered))).is_empty());
    assert!(unreached(&validate(&rs, None)).is_empty());
    // Forwarding off for IPv4 only: the IPv4 FORWARD chains are warned.
    let no_fwd = Reach(Arc::new(ReachedHooks::delivered(
        &[Hook::Input, Hook::Output],
        &all,
        "IPv4 forwarding is off",
    )));
    assert_eq!(unreached(&validate(&rs, Some(&no_fwd))).len(), 2);
}

/// [`ViolationKind::StateNotQueued`]: where only new connections are steered, a state match
/// naming only ESTABLISHED and RELATED is a warning at its rule; other state matches, and the
/// same ruleset with every packet steered, warn nothing.
#[test]
fn established_only_rules_are_warned_when_only_new_packets_are_queued() {
    let text = "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
        -A INPUT -m state --state ESTABLISHED -j ACCEPT\n\
        -A INPUT -m conntrack ! --ctstate ESTABLISHED -j LOG\n\
        -A INPUT -m conntrack --ctstate NEW,ESTABLISHED -j ACCEPT\n\
        -A INPUT -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n";
    let rs = parse_ruleset("host", text, &ParseOptions::default()).unwrap();
    let all = [Hook::Input, Hook::Forward, Hook::Output];
    let new_only = Reach(Arc::new(
        ReachedHooks::delivered(&all, &all, "").new_only("the kernel accepts"),
    ));
    let got: Vec<String> = validate(&rs, Some(&new_only))
        .iter()
        .filter(|v| matches!(v.kind, ViolationKind::StateNotQueued(..)))
        .map(|v| {
            assert_eq!(v.severity, Severity::Warning, "{v}");
            v.to_string()
        })
        .collect();
    assert_eq!(got.len(), 3, "{got:#?}");
    assert!(
        got[0].starts_with("5:1: warning: filter/INPUT#1: --ctstate ESTABLISHED,RELATED matches only packets of established or related connections, which the kernel accepts: here it never matches"),
        "{}",
        got[0]
    );
    assert!(
        got[1].contains("INPUT#2: --state ESTABLISHED"),
        "{}",
        got[1]
    );
    assert!(
        got[2].contains("INPUT#3: ! --ctstate ESTABLISHED")
            && got[2].ends_with("(and its negation always does)"),
        "{}",
        got[2]
    );
    let every = Reach(Arc::new(ReachedHooks::delivered(&all, &all, "")));
    assert!(
        validate(&rs, Some(&every))
            .iter()
            .all(|v| !matches!(v.kind, ViolationKind::StateNotQueued(..)))
    );
}
