//! `-m policy` (IPsec), stored only: checked as iptables 1.8.9's libxt_policy parses it and
//! rewritten into what iptables-save prints (each form checked by `libxt_policy.t`,
//! `tests/it/conformance.rs`):
//!
//! - `--dir in|out` (required), `--pol none|ipsec` (default ipsec, always printed), `--strict`;
//! - the elements, separated by `--next` (which needs `--strict`; at most 4 elements):
//!   `[!] --reqid N` (32-bit), `[!] --spi N` (32-bit, printed `0x%x`), `[!] --proto
//!   ah|esp|ipcomp` (a name or number), `[!] --mode transport|tunnel`, `[!] --tunnel-src` and
//!   `[!] --tunnel-dst ADDR[/LEN]` (only in tunnel mode; the address is kept unmasked, as
//!   iptables-save prints it; a dotted mask must be contiguous), each at most once an element;
//!   printed in libxt_policy's order (reqid, spi, proto, mode, tunnel-dst, tunnel-src);
//! - `--pol none` takes no `--strict` and no `--next`, and prints no element (libxt_policy
//!   keeps none); with `--strict` every element needs one of the element options.
//!
//! The kernel's own check (policy_mt_check) refuses `--dir in` in OUTPUT and POSTROUTING and
//! `--dir out` in PREROUTING and INPUT; a ruleset that does so is refused by the kernel's
//! load, not by this parser (a user chain's hooks are known only once the table is read).

use crate::model::{Family, OpaqueOption};

use super::super::ParseError;
use super::super::extensions::{parse_protocol, parse_uint};
use super::super::lexer::Tok;
use super::super::rule::Ctx;
use super::{one_arg, opt};

/// The most elements a policy holds (XT_POLICY_MAX_ELEM).
const MAX_ELEMENTS: usize = 4;

/// The element options in the order iptables-save prints them.
const ELEMENT_ORDER: [&str; 6] = [
    "--reqid",
    "--spi",
    "--proto",
    "--mode",
    "--tunnel-dst",
    "--tunnel-src",
];

/// Rewrites the options of `-m policy` (see the module docs).
pub(super) fn policy(
    options: &mut Vec<OpaqueOption>,
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    let (mut dir, mut none, mut strict, mut pol_seen) = (None, false, false, false);
    // Each element: its options by ELEMENT_ORDER index (negated, canonical value).
    let mut elements: Vec<[Option<(bool, String)>; 6]> = vec![Default::default()];
    // The mode each element asked for (`Some(tunnel)`), and whether it was negated.
    let mut modes: Vec<Option<(bool, bool)>> = vec![None];
    for o in options.iter() {
        let once = |seen: bool| {
            if seen {
                Err(bad(format!("option \"{}\" can only be used once", o.name)))
            } else {
                Ok(())
            }
        };
        let no_invert = || {
            if o.negated {
                Err(bad(format!("option \"{}\" cannot be inverted", o.name)))
            } else {
                Ok(())
            }
        };
        match o.name.as_str() {
            "--dir" => {
                once(dir.is_some())?;
                no_invert()?;
                dir = Some(match one_arg(o, bad)? {
                    "in" => "in",
                    "out" => "out",
                    d => return Err(bad(format!("invalid dir \"{d}\""))),
                });
            }
            "--pol" => {
                once(pol_seen)?;
                no_invert()?;
                pol_seen = true;
                none = match one_arg(o, bad)? {
                    "none" => true,
                    "ipsec" => false,
                    p => return Err(bad(format!("invalid policy \"{p}\""))),
                };
            }
            "--strict" | "--next" => {
                no_invert()?;
                if !o.args.is_empty() {
                    return Err(bad(format!("option \"{}\" takes no argument", o.name)));
                }
                if o.name == "--strict" {
                    once(strict)?;
                    strict = true;
                } else {
                    if elements.len() == MAX_ELEMENTS {
                        return Err(bad("maximum policy depth reached".into()));
                    }
                    elements.push(Default::default());
                    modes.push(None);
                }
            }
            name => {
                let Some(i) = ELEMENT_ORDER.iter().position(|n| *n == name) else {
                    return Err(bad(format!("unknown option \"{name}\"")));
                };
                let a = one_arg(o, bad)?;
                let value = match name {
                    "--reqid" => parse_uint(a, u64::from(u32::MAX))
                        .ok_or_else(|| bad(format!("bad value \"{a}\" for \"--reqid\"")))?
                        .to_string(),
                    "--spi" => format!(
                        "{:#x}",
                        parse_uint(a, u64::from(u32::MAX))
                            .ok_or_else(|| bad(format!("bad value \"{a}\" for \"--spi\"")))?
                    ),
                    "--proto" => {
                        let t = Tok {
                            text: a,
                            column: token.column,
                        };
                        match parse_protocol(&t, ctx)? {
                            50 => "esp",
                            51 => "ah",
                            108 => "ipcomp",
                            _ => return Err(bad("protocol must be ah/esp/ipcomp".into())),
                        }
                        .to_string()
                    }
                    "--mode" => {
                        let tunnel = match a {
                            "transport" => false,
                            "tunnel" => true,
                            m => return Err(bad(format!("invalid mode \"{m}\""))),
                        };
                        *modes.last_mut().expect("one element at least") =
                            Some((tunnel, o.negated));
                        a.to_string()
                    }
                    _ => tunnel_address(a, ctx.family).map_err(bad)?,
                };
                let slot = &mut elements.last_mut().expect("one element at least")[i];
                if slot.is_some() {
                    return Err(bad(format!("double {name} option")));
                }
                *slot = Some((o.negated, value));
            }
        }
    }
    let Some(dir) = dir else {
        return Err(bad("neither --dir in nor --dir out specified".into()));
    };
    if elements.len() > 1 && !strict {
        return Err(bad("option \"--next\" also requires \"--strict\"".into()));
    }
    if none && strict {
        return Err(bad("policy none but --strict given".into()));
    }
    if none && elements.len() > 1 {
        return Err(bad("policy none but policy given".into()));
    }
    for (i, (e, mode)) in elements.iter().zip(&modes).enumerate() {
        if strict && e.iter().all(Option::is_none) {
            return Err(bad(format!(
                "empty policy element {i}: --strict is in effect, but at least one of reqid, \
                 spi, tunnel-src, tunnel-dst, proto or mode is required"
            )));
        }
        // An element without --mode is transport mode (0), not negated.
        let (tunnel, negated) = mode.unwrap_or((false, false));
        if (e[4].is_some() || e[5].is_some()) && tunnel == negated {
            return Err(bad(
                "--tunnel-src/--tunnel-dst is only valid in tunnel mode".into(),
            ));
        }
    }
    let mut out = vec![
        opt("--dir", false, vec![dir.to_string()]),
        opt(
            "--pol",
            false,
            vec![if none { "none" } else { "ipsec" }.to_string()],
        ),
    ];
    if strict {
        out.push(opt("--strict", false, Vec::new()));
    }
    // `--pol none` keeps no element (libxt_policy's len stays 0).
    let kept = if none { 0 } else { elements.len() };
    for (i, e) in elements.iter().take(kept).enumerate() {
        if i > 0 {
            out.push(opt("--next", false, Vec::new()));
        }
        for (name, slot) in ELEMENT_ORDER.iter().zip(e) {
            if let Some((negated, value)) = slot {
                out.push(opt(name, *negated, vec![value.clone()]));
            }
        }
    }
    *options = out;
    Ok(())
}

/// `--tunnel-src`/`--tunnel-dst`: `ADDR[/LEN]` or `ADDR/MASK` with a contiguous mask, printed
/// `ADDR` for a full-length prefix, else `ADDR/LEN`, the address as written (not masked).
fn tunnel_address(s: &str, family: Family) -> Result<String, String> {
    let (a, m) = s.split_once('/').unwrap_or((s, ""));
    let addr: Option<std::net::IpAddr> = match family {
        Family::Ipv4 => a.parse::<std::net::Ipv4Addr>().ok().map(Into::into),
        Family::Ipv6 => a.parse::<std::net::Ipv6Addr>().ok().map(Into::into),
    };
    let addr = addr.ok_or_else(|| format!("'{a}' is not an address of the rule's family"))?;
    let width: u32 = if family == Family::Ipv4 { 32 } else { 128 };
    let len = if m.is_empty() {
        width
    } else if let Some(l) = parse_uint(m, u64::from(width)) {
        l as u32
    } else {
        let bits = match (family, m.parse::<std::net::IpAddr>()) {
            (Family::Ipv4, Ok(std::net::IpAddr::V4(x))) => u128::from(u32::from(x)) << 96,
            (Family::Ipv6, Ok(std::net::IpAddr::V6(x))) => u128::from(x),
            _ => return Err(format!("'{m}' is not a prefix length or mask")),
        };
        if bits.leading_ones() + bits.trailing_zeros() != 128 && bits != 0 {
            return Err(format!("'{m}': only contiguous masks are taken here"));
        }
        bits.leading_ones()
    };
    Ok(if len == width {
        addr.to_string()
    } else {
        format!("{addr}/{len}")
    })
}

#[cfg(test)]
mod tests {
    use crate::model::Family;
    use crate::restore::{ParseOptions, parse, print_rule_spec};

    fn rule(family: Family, rule: &str) -> Result<String, String> {
        let text = format!("*filter\n-A INPUT {rule}\nCOMMIT\n");
        let opts = ParseOptions {
            family,
            ..ParseOptions::default()
        };
        let r = parse(&text, &opts).map_err(|e| e.to_string())?;
        let chain = r.tables[0].chain("INPUT").expect("INPUT");
        Ok(print_rule_spec(&chain.rules[0], family))
    }

    /// The forms iptables-legacy 1.8.9 saves (measured; `tests/it/kernel_loads.rs` compares them
    /// with the kernel where it runs).
    #[test]
    fn policy_is_printed_as_iptables_save() {
        let v4 = Family::Ipv4;
        for (input, saved) in [
            ("-m policy --dir in", "-m policy --dir in --pol ipsec"),
            (
                "-m policy --dir in --pol none --proto esp",
                "-m policy --dir in --pol none",
            ),
            (
                "-m policy --dir in --pol ipsec --mode tunnel --tunnel-src 1.2.3.0/24 \
                 --tunnel-dst 1.2.3.4 ! --spi 10 --reqid 0x10 --proto 50",
                "-m policy --dir in --pol ipsec --reqid 16 ! --spi 0xa --proto esp --mode tunnel \
                 --tunnel-dst 1.2.3.4 --tunnel-src 1.2.3.0/24",
            ),
            (
                "-m policy --dir in --pol ipsec --mode tunnel --tunnel-src 1.2.3.5/255.255.255.0",
                "-m policy --dir in --pol ipsec --mode tunnel --tunnel-src 1.2.3.5/24",
            ),
            (
                "-m policy --dir out --pol ipsec --strict --proto esp --next --proto ipcomp",
                "-m policy --dir out --pol ipsec --strict --proto esp --next --proto ipcomp",
            ),
        ] {
            assert_eq!(rule(v4, input).as_deref(), Ok(saved), "{input}");
        }
        assert_eq!(
            rule(
                Family::Ipv6,
                "-m policy --dir in --pol ipsec --mode tunnel --tunnel-src dead::1/64 \
                 --tunnel-dst ::1"
            )
            .as_deref(),
            Ok(
                "-m policy --dir in --pol ipsec --mode tunnel --tunnel-dst ::1 --tunnel-src dead::1/64"
            )
        );
    }

    /// Each of libxt_policy's refusals, located at the rule's line.
    #[test]
    fn policy_refuses_as_libxt_policy() {
        for bad in [
            "-m policy --pol ipsec",
            "-m policy ! --dir in",
            "-m policy --dir in ! --pol ipsec",
            "-m policy --dir in --dir out",
            "-m policy --dir up",
            "-m policy --dir in --pol some",
            "-m policy --dir in --pol none --strict",
            "-m policy --dir in --pol none --strict --proto esp --next --proto esp",
            "-m policy --dir in --pol ipsec --strict",
            "-m policy --dir in --pol ipsec --proto esp --next --proto ah",
            "-m policy --dir in --pol ipsec --proto tcp",
            "-m policy --dir in --pol ipsec --proto esp --proto ah",
            "-m policy --dir in --pol ipsec --tunnel-src 1.2.3.4",
            "-m policy --dir in --pol ipsec --mode tunnel ! --mode tunnel",
            "-m policy --dir in --pol ipsec ! --mode tunnel --tunnel-src 1.2.3.4",
            "-m policy --dir in --pol ipsec --spi 4294967296",
            "-m policy --dir in --pol ipsec --mode tunnel --tunnel-src 1.2.3.4/255.0.255.0",
            "-m policy --dir in --pol ipsec --strict --proto esp --next --proto esp --next \
             --proto esp --next --proto esp --next --proto ah",
            "-m policy --dir in --pol ipsec --bogus 1",
        ] {
            let e = rule(Family::Ipv4, bad).expect_err(bad);
            assert!(e.starts_with("2:"), "{bad}: {e}");
        }
    }
}
