//! The bundled example ruleset (`server/examples/host-firewall.rules`): a host firewall for a
//! container/Kubernetes node, IPv4 and IPv6, loaded by `vallumd --example` on first start.

use vallum_engine::model::Family;

use crate::control::content::{RulesetInput, TextPart, V6_SEPARATOR};

/// Name of the example ruleset.
pub const NAME: &str = "host-firewall";

/// The example text: IPv4 part, [`V6_SEPARATOR`], IPv6 part.
pub const TEXT: &str = include_str!("../../examples/host-firewall.rules");

/// The example as a request input (two texts).
pub fn input() -> RulesetInput {
    let (v4, v6) = TEXT.split_once(V6_SEPARATOR).unwrap_or((TEXT, ""));
    let mut parts = vec![TextPart {
        text: v4.to_string(),
        family: Family::Ipv4,
        filename: "host-firewall.rules".into(),
        field: "example".into(),
        line_fields: None,
    }];
    if !v6.is_empty() {
        parts.push(TextPart {
            text: v6.to_string(),
            family: Family::Ipv6,
            filename: "host-firewall.rules (v6)".into(),
            field: "example".into(),
            line_fields: None,
        });
    }
    RulesetInput { parts, nft: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vallum_engine::sets::NoSets;

    #[test]
    fn example_is_valid_and_has_both_families() {
        let c = crate::control::content::check(NAME, 0, &input()).unwrap();
        let violations = vallum_engine::validate::validate(&c.ruleset, Some(&NoSets));
        let c = c.with_violations(&violations);
        let errors: Vec<_> = c
            .findings
            .iter()
            .filter(|f| f.severity == vallum_engine::validate::Severity::Error)
            .collect();
        assert!(errors.is_empty(), "{errors:#?}");
        assert!(!c.content.v4().is_empty() && !c.content.v6().is_empty());
        assert!(c.ruleset.rule_count() > 50);
    }
}
