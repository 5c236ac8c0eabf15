//! One rule through the parser and the canonical printer, for the save-form tables of the
//! extension tests (`addrtype.rs`, `header_matches.rs`).

use vallum_engine::model::Family;
use vallum_engine::restore::{ParseOptions, parse, print_rule_spec};

/// Parse options for `family`, everything else default.
pub fn opts(family: Family) -> ParseOptions<'static> {
    ParseOptions {
        family,
        ..ParseOptions::default()
    }
}

/// `rule` appended to filter INPUT, printed back as iptables-save prints it; the first parse
/// error as text otherwise.
pub fn printed(family: Family, rule: &str) -> Result<String, String> {
    let text = format!("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT {rule}\nCOMMIT\n");
    let r = parse(&text, &opts(family)).map_err(|e| e.0[0].to_string())?;
    let c = r.tables[0].chain("INPUT").expect("INPUT");
    Ok(print_rule_spec(&c.rules[0], family))
}
