//! proto <-> domain conversions of the SetService: requests to [`SetSpec`] and
//! [`ElementInput`]s (field paths `type`, `elements[3]`, `elements[3].address`), sets and
//! elements back to proto.

use std::net::IpAddr;

use vallum_engine::echo::quoted;
use vallum_engine::sets::{ListedElement, SetSpec, SetSummary, SetType};
use vallum_proto::v1 as pb;

use super::{bad_request, family_of, family_pb};
use crate::control::pipeline::sets::{ElementInput, check_set_name};
use crate::error::{Error, FieldViolation, Result};

/// The name and spec of a CreateSet request (0 for hashsize / maxelem: ipset's defaults).
///
/// Errors: [`Error::BadRequest`] on `name`, `type`, `family`.
pub fn create_spec(r: &pb::CreateSetRequest) -> Result<(String, SetSpec)> {
    // The optional `sets/` prefix every other call strips: without stripping it here too,
    // `sets/x` would create a set that DestroySet / GetSet `sets/x` cannot find.
    let name = r.name.strip_prefix("sets/").unwrap_or(&r.name);
    check_set_name("name", name)?;
    let kind = SetType::from_name(&r.r#type).ok_or_else(|| {
        Error::invalid(
            "type",
            format!(
                "unsupported set type {} (hash:ip, hash:net, hash:ip,port, hash:net,port)",
                quoted(&r.r#type)
            ),
        )
    })?;
    let mut spec = SetSpec::new(kind, family_of("family", r.family)?);
    if r.hashsize != 0 {
        spec.hashsize = r.hashsize;
    }
    if r.maxelem != 0 {
        spec.maxelem = r.maxelem;
    }
    spec.timeout = r.timeout;
    spec.counters = r.counters;
    Ok((name.to_string(), spec))
}

/// The ipset text of one structured element.
fn structured_text(field: &str, e: &pb::SetElement) -> Result<String, FieldViolation> {
    let ip: IpAddr = e.address.parse().map_err(|_| {
        FieldViolation::new(
            format!("{field}.address"),
            format!("{} is not an IPv4 or IPv6 address", quoted(&e.address)),
        )
    })?;
    let mut text = ip.to_string();
    if e.prefix_len != 0 {
        text.push_str(&format!("/{}", e.prefix_len));
    }
    if !e.protocol.is_empty() || e.port != 0 {
        let proto = if e.protocol.is_empty() {
            "tcp"
        } else {
            e.protocol.as_str()
        };
        text.push_str(&format!(",{proto}:{}", e.port));
    }
    Ok(text)
}

/// The elements of an Add/DeleteElements request: each has `text` or `address` (not both).
/// Every malformed entry is listed (`elements[i]`, `elements[i].address`); whether the text
/// fits the set is checked by the pipeline against the set's type.
///
/// Errors: [`Error::BadRequest`].
pub fn element_inputs(field: &str, elements: &[pb::SetElement]) -> Result<Vec<ElementInput>> {
    if elements.is_empty() {
        return Err(Error::invalid(field, "at least one element is required"));
    }
    let mut out = Vec::with_capacity(elements.len());
    let mut violations = Vec::new();
    for (i, e) in elements.iter().enumerate() {
        let f = || format!("{field}[{i}]");
        let structured =
            !e.address.is_empty() || e.prefix_len != 0 || !e.protocol.is_empty() || e.port != 0;
        let text = match (e.text.is_empty(), structured) {
            (false, false) => Ok(e.text.trim().to_string()),
            (true, true) => structured_text(&f(), e),
            (false, true) => Err(FieldViolation::new(
                f(),
                "give either text or the structured fields (address, ...), not both",
            )),
            (true, false) => Err(FieldViolation::new(
                f(),
                "an element needs text (ipset syntax) or an address",
            )),
        };
        match text {
            Ok(text) => out.push(ElementInput {
                text,
                timeout: e.timeout,
            }),
            Err(v) => violations.push(v),
        }
    }
    if violations.is_empty() {
        Ok(out)
    } else {
        Err(bad_request(violations))
    }
}

/// A set's header with the active rulesets referencing it and its etag (the store's).
pub fn set_pb(s: &SetSummary, referenced_by: Vec<String>, etag: String) -> pb::Set {
    pb::Set {
        name: s.name.clone(),
        r#type: s.spec.kind.name().to_string(),
        family: family_pb(s.spec.family) as i32,
        hashsize: s.spec.hashsize,
        maxelem: s.spec.maxelem,
        timeout: s.spec.timeout,
        counters: s.spec.counters,
        entries: s.entries as u64,
        referenced_by,
        etag,
    }
}

/// A listed element: text, seconds left (sets with timeouts), counters (sets with counters).
pub fn element_pb(e: &ListedElement) -> pb::SetElement {
    let (packets, bytes) = e.counters.unwrap_or((0, 0));
    pb::SetElement {
        text: e.text.clone(),
        timeout: e.timeout.map(|t| u32::try_from(t).unwrap_or(u32::MAX)),
        packets,
        bytes,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vallum_engine::model::Family;

    #[test]
    fn structured_and_text_elements() {
        let els = vec![
            pb::SetElement {
                text: "10.0.0.0/8".into(),
                ..Default::default()
            },
            pb::SetElement {
                address: "192.0.2.1".into(),
                protocol: "udp".into(),
                port: 53,
                timeout: Some(5),
                ..Default::default()
            },
            pb::SetElement {
                address: "2001:db8::".into(),
                prefix_len: 32,
                ..Default::default()
            },
        ];
        let got = element_inputs("elements", &els).unwrap();
        let texts: Vec<&str> = got.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, ["10.0.0.0/8", "192.0.2.1,udp:53", "2001:db8::/32"]);
        assert_eq!(got[1].timeout, Some(5));

        let bad = vec![
            pb::SetElement::default(),
            pb::SetElement {
                address: "nope".into(),
                ..Default::default()
            },
            pb::SetElement {
                text: "1.2.3.4".into(),
                address: "1.2.3.4".into(),
                ..Default::default()
            },
            // A port next to text would be dropped silently.
            pb::SetElement {
                text: "1.2.3.4".into(),
                port: 80,
                ..Default::default()
            },
        ];
        let Err(Error::BadRequest { violations, .. }) = element_inputs("elements", &bad) else {
            panic!("expected a bad request");
        };
        let fields: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "elements[0]",
                "elements[1].address",
                "elements[2]",
                "elements[3]"
            ]
        );
    }

    #[test]
    fn create_defaults_and_errors() {
        let (name, spec) = create_spec(&pb::CreateSetRequest {
            name: "f2b".into(),
            r#type: "hash:ip".into(),
            timeout: Some(600),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(name, "f2b");
        assert_eq!(
            (spec.maxelem, spec.hashsize, spec.timeout),
            (65536, 1024, Some(600))
        );
        assert_eq!(spec.family, Family::Ipv4);
        let e = create_spec(&pb::CreateSetRequest {
            name: "x".into(),
            r#type: "hash:mac".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("type"), "{e}");
        // The resource form names the same set as in the other calls.
        let (name, _) = create_spec(&pb::CreateSetRequest {
            name: "sets/f2b".into(),
            r#type: "hash:ip".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(name, "f2b");
    }
}
