//! Node selectors and node labels.
//!
//! A selector is a comma-separated list of requirements that must all hold, as Kubernetes
//! label selectors: `k=v` (also `k==v`), `k!=v` (true when `k` is absent), `k in (a,b)`,
//! `k notin (a,b)` (true when `k` is absent), `k` (present), `!k` (absent). The empty
//! selector selects every node. Keys and values are 1-63 characters of `A-Z a-z 0-9 . _ - /`.

use super::Labels;

/// One requirement of a [`Selector`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// `k=v`.
    Equals(String, String),
    /// `k!=v`.
    NotEquals(String, String),
    /// `k in (a,b)`.
    In(String, Vec<String>),
    /// `k notin (a,b)`.
    NotIn(String, Vec<String>),
    /// `k`.
    Exists(String),
    /// `!k`.
    NotExists(String),
}

/// A parsed node selector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    /// All must hold.
    pub requirements: Vec<Requirement>,
}

impl Selector {
    /// Parses `text`.
    ///
    /// Errors: `COL: message` (1-based column of the offending token).
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Selector { requirements });
        }
        let mut rest = text;
        let mut col = 1usize;
        loop {
            // A requirement ends at a comma outside parentheses.
            let mut depth = 0i32;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    c == ',' && depth == 0
                })
                .map_or(rest.len(), |(i, _)| i);
            requirements.push(requirement(&rest[..end], col)?);
            if end == rest.len() {
                break;
            }
            col += end + 1;
            rest = &rest[end + 1..];
        }
        Ok(Selector { requirements })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

fn requirement(part: &str, col: usize) -> Result<Requirement, String> {
    let lead = part.len() - part.trim_start().len();
    let col = col + lead;
    let p = part.trim();
    if p.is_empty() {
        return Err(format!("{col}: empty requirement"));
    }
    if let Some(k) = p.strip_prefix('!') {
        if !k.contains('=') {
            return Ok(Requirement::NotExists(word(k.trim(), col + 1)?));
        }
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(Requirement::NotEquals(
            word(k.trim(), col)?,
            word(v.trim(), col + k.len() + 2)?,
        ));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        let off = if p.contains("==") { 2 } else { 1 };
        return Ok(Requirement::Equals(
            word(k.trim(), col)?,
            word(v.trim(), col + k.len() + off)?,
        ));
    }
    let mut it = p.splitn(2, char::is_whitespace);
    let key = word(it.next().unwrap_or(""), col)?;
    let Some(rest) = it.next().map(str::trim) else {
        return Ok(Requirement::Exists(key));
    };
    let (op, list) = if let Some(l) = rest.strip_prefix("notin") {
        ("notin", l)
    } else if let Some(l) = rest.strip_prefix("in") {
        ("in", l)
    } else {
        return Err(format!(
            "{}: expected =, !=, in or notin after {key:?}, found {rest:?}",
            col + key.len() + 1
        ));
    };
    let list = list.trim();
    let inner = list
        .strip_prefix('(')
        .and_then(|l| l.strip_suffix(')'))
        .ok_or_else(|| {
            format!(
                "{}: expected a parenthesised list after {op}, found {list:?}",
                col + key.len() + 1
            )
        })?;
    let values = inner
        .split(',')
        .map(|v| word(v.trim(), col))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if op == "in" {
        Requirement::In(key, values)
    } else {
        Requirement::NotIn(key, values)
    })
}

fn word(s: &str, col: usize) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{col}: {s:?} is not a label key or value (1-63 characters of A-Z a-z 0-9 . _ - /)"
        ))
    }
}

/// Parses `--node-labels` (`k=v,k2=v2`; empty: no labels).
///
/// Errors: a message naming the bad item.
pub fn parse_labels(s: &str) -> Result<Labels, String> {
    let mut labels = Labels::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not k=v"))?;
        let k = word(k.trim(), 1).map_err(|e| format!("{item:?}: {e}"))?;
        let v = word(v.trim(), 1).map_err(|e| format!("{item:?}: {e}"))?;
        if labels.insert(k.clone(), v).is_some() {
            return Err(format!("label {k:?} given twice"));
        }
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(s: &str) -> Labels {
        parse_labels(s).unwrap()
    }

    #[test]
    fn every_operator_matches_as_kubernetes() {
        let l = labels("role=web,zone=a");
        let yes = [
            "",
            "role=web",
            "role==web",
            "role!=db",
            "missing!=x",
            "zone in (a,b)",
            "zone notin (c)",
            "missing notin (c)",
            "role",
            "!missing",
            "role=web, zone in (a, b)",
        ];
        for s in yes {
            assert!(Selector::parse(s).unwrap().matches(&l), "{s:?}");
        }
        let no = [
            "role=db",
            "role!=web",
            "zone in (b,c)",
            "zone notin (a)",
            "missing",
            "!role",
            "role=web,zone=b",
        ];
        for s in no {
            assert!(!Selector::parse(s).unwrap().matches(&l), "{s:?}");
        }
    }

    #[test]
    fn bad_selectors_say_where() {
        let e = Selector::parse("role=web,zone inn (a)").unwrap_err();
        assert!(e.starts_with("15: expected"), "{e}");
        let e = Selector::parse("role=we b").unwrap_err();
        assert!(e.starts_with("6: "), "{e}");
        assert!(Selector::parse("role=web,,x").is_err());
        assert!(Selector::parse("zone in a,b").is_err());
    }

    #[test]
    fn labels_parse_and_refuse_duplicates() {
        assert_eq!(labels("").len(), 0);
        assert_eq!(labels("a=1, b=2")["b"], "2");
        assert!(parse_labels("a").is_err());
        assert!(parse_labels("a=1,a=2").is_err());
    }
}
