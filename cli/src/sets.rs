//! `vallumctl set ...`: the SetService with ipset's command words and output.
//!
//! | vallumctl | ipset |
//! |---|---|
//! | `set create NAME TYPE [family inet6] [hashsize N] [maxelem N] [timeout N] [counters] [--exist]` | `ipset create` |
//! | `set add NAME ELEM [timeout N] [ELEM [timeout N] ...] [--file F] [--exist]` | `ipset add` (many at once) |
//! | `set del NAME ELEM... [--file F] [--exist]` | `ipset del` |
//! | `set list [NAME] [--terse]`, `set show NAME` | `ipset list` |
//! | `set flush NAME`, `set swap FROM TO`, `set destroy NAME` | `ipset flush/swap/destroy` |
//! | `set import [FILE]` (stdin: `-`) | `ipset restore < FILE` |
//! | `set save [NAME]` | `ipset save` |
//!
//! Elements use ipset's syntax (`10.0.0.0/8`, `192.0.2.1,tcp:80`); `--file` reads one element a
//! line (`ELEM [timeout N]`, `#` comments), `-` for stdin.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::{Value, json};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use vallum_proto::v1::set_service_client::SetServiceClient;
use vallum_proto::v1::{self as pb, Family};

use crate::connect::Auth;
use crate::error::CliError;
use crate::input::{display_name, read_text, with_file};
use crate::output::{Output, print, write_stdout};
use crate::pages::{PAGE_SIZE, all_pages};

/// The client type.
pub type Client = SetServiceClient<InterceptedService<Channel, Auth>>;

/// `vallumctl set` subcommands.
#[derive(Debug, Subcommand)]
pub enum SetCommand {
    /// Create a set: `NAME TYPE [family inet|inet6] [hashsize N] [maxelem N] [timeout N] [counters]`.
    Create {
        /// Set name (1-31 bytes).
        name: String,
        /// hash:ip, hash:net, hash:ip,port or hash:net,port.
        #[arg(value_name = "TYPE")]
        kind: String,
        /// ipset create options: family inet|inet6, hashsize N, maxelem N, timeout N, counters.
        #[arg(value_name = "OPTION")]
        options: Vec<String>,
        /// No error when an identical set exists (ipset -exist).
        #[arg(long)]
        exist: bool,
    },
    /// Add elements: NAME ELEM [timeout N] [ELEM [timeout N] ...].
    Add {
        /// Set name.
        name: String,
        /// Elements, each optionally followed by `timeout N`.
        #[arg(value_name = "ELEM")]
        elements: Vec<String>,
        /// Also read elements from this file (one a line; `-` for stdin).
        #[arg(long, short = 'f', value_name = "FILE")]
        file: Option<PathBuf>,
        /// Renew elements that are already there instead of failing (ipset -exist).
        #[arg(long)]
        exist: bool,
    },
    /// Delete elements: NAME ELEM...
    Del {
        /// Set name.
        name: String,
        /// Elements.
        #[arg(value_name = "ELEM")]
        elements: Vec<String>,
        /// Also read elements from this file (one a line; `-` for stdin).
        #[arg(long, short = 'f', value_name = "FILE")]
        file: Option<PathBuf>,
        /// Elements that are not there are not an error (ipset -exist).
        #[arg(long)]
        exist: bool,
    },
    /// List sets with their elements, as `ipset list` (one set with NAME).
    List {
        /// Only this set.
        name: Option<String>,
        /// Headers only, no members (ipset list -terse).
        #[arg(long)]
        terse: bool,
    },
    /// One set with its elements (as `ipset list NAME`).
    Show {
        /// Set name.
        name: String,
    },
    /// Remove every element of a set.
    Flush {
        /// Set name.
        name: String,
    },
    /// Exchange the contents of two sets of the same type and family.
    Swap {
        /// First set.
        from: String,
        /// Second set.
        to: String,
    },
    /// Destroy a set (refused while an active ruleset references it).
    Destroy {
        /// Set name.
        name: String,
    },
    /// Load `ipset save` text (create/add lines), all or nothing (ipset restore).
    Import {
        /// The file; `-` (default) for stdin.
        #[arg(default_value = "-")]
        file: PathBuf,
    },
    /// Print sets as `ipset save` text.
    Save {
        /// Only this set.
        name: Option<String>,
    },
}

/// Elements from words: `ELEM [timeout N] ELEM ...`.
fn parse_elements(words: &[&str], with_timeout: bool) -> Result<Vec<pb::SetElement>, CliError> {
    let mut out: Vec<pb::SetElement> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if words[i] == "timeout" {
            let (Some(last), true) = (out.last_mut(), with_timeout) else {
                return Err(CliError::Argument(
                    "`timeout N` must follow an element of `set add`".into(),
                ));
            };
            let n = words
                .get(i + 1)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| CliError::Argument("`timeout` needs a number of seconds".into()))?;
            last.timeout = Some(n);
            i += 2;
            continue;
        }
        out.push(pb::SetElement {
            text: words[i].to_string(),
            ..Default::default()
        });
        i += 1;
    }
    Ok(out)
}

fn elements(
    args: &[String],
    file: Option<&Path>,
    with_timeout: bool,
) -> Result<Vec<pb::SetElement>, CliError> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut out = parse_elements(&words, with_timeout)?;
    if let Some(f) = file {
        let text = read_text(f)?;
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            out.extend(parse_elements(&words, with_timeout)?);
        }
    }
    if out.is_empty() {
        return Err(CliError::Argument("no element given".into()));
    }
    Ok(out)
}

fn create_request(
    name: &str,
    kind: &str,
    options: &[String],
    exist: bool,
) -> Result<pb::CreateSetRequest, CliError> {
    let mut r = pb::CreateSetRequest {
        name: name.to_string(),
        r#type: kind.to_string(),
        exist,
        ..Default::default()
    };
    let mut it = options.iter();
    let number = |what: &str, v: Option<&String>| -> Result<u32, CliError> {
        v.and_then(|v| v.parse().ok())
            .ok_or_else(|| CliError::Argument(format!("`{what}` needs a number")))
    };
    while let Some(o) = it.next() {
        match o.as_str() {
            "family" => {
                r.family = match it.next().map(String::as_str) {
                    Some("inet") => Family::Ipv4,
                    Some("inet6") => Family::Ipv6,
                    _ => return Err(CliError::Argument("`family` is inet or inet6".into())),
                } as i32;
            }
            "hashsize" => r.hashsize = number("hashsize", it.next())?,
            "maxelem" => r.maxelem = number("maxelem", it.next())?,
            "timeout" => r.timeout = Some(number("timeout", it.next())?),
            "counters" => r.counters = true,
            "-exist" => r.exist = true,
            other => {
                return Err(CliError::Argument(format!(
                    "unknown create option `{other}` (family, hashsize, maxelem, timeout, counters)"
                )));
            }
        }
    }
    Ok(r)
}

fn family_word(f: i32) -> &'static str {
    match Family::try_from(f) {
        Ok(Family::Ipv6) => "inet6",
        _ => "inet",
    }
}

/// The `Header:` line of `ipset list`.
fn header(s: &pb::Set) -> String {
    let mut h = format!(
        "family {} hashsize {} maxelem {}",
        family_word(s.family),
        s.hashsize,
        s.maxelem
    );
    if let Some(t) = s.timeout {
        let _ = write!(h, " timeout {t}");
    }
    if s.counters {
        h.push_str(" counters");
    }
    h
}

fn element_line(e: &pb::SetElement, set: &pb::Set) -> String {
    let mut l = e.text.clone();
    if let (Some(t), Some(_)) = (e.timeout, set.timeout) {
        let _ = write!(l, " timeout {t}");
    }
    if set.counters {
        let _ = write!(l, " packets {} bytes {}", e.packets, e.bytes);
    }
    l
}

/// One set as `ipset list` prints it (members only with `members`).
pub fn set_text(s: &pb::Set, members: Option<&[pb::SetElement]>) -> String {
    let mut out = format!(
        "Name: {}\nType: {}\nHeader: {}\nReferences: {}\nNumber of entries: {}\n",
        s.name,
        s.r#type,
        header(s),
        s.referenced_by.len(),
        s.entries
    );
    if !s.referenced_by.is_empty() {
        let _ = writeln!(out, "Referenced by: {}", s.referenced_by.join(", "));
    }
    if let Some(members) = members {
        out.push_str("Members:\n");
        for e in members {
            out.push_str(&element_line(e, s));
            out.push('\n');
        }
    }
    out
}

fn set_json(s: &pb::Set, members: Option<&[pb::SetElement]>) -> Value {
    let mut j = json!({
        "name": s.name,
        "type": s.r#type,
        "family": family_word(s.family),
        "hashsize": s.hashsize,
        "maxelem": s.maxelem,
        "timeout": s.timeout,
        "counters": s.counters,
        "entries": s.entries,
        "referenced_by": s.referenced_by,
    });
    if let Some(members) = members {
        j["members"] = members
            .iter()
            .map(|e| {
                let mut m = json!({"element": e.text});
                if s.timeout.is_some() {
                    m["timeout"] = json!(e.timeout);
                }
                if s.counters {
                    m["packets"] = json!(e.packets);
                    m["bytes"] = json!(e.bytes);
                }
                m
            })
            .collect();
    }
    j
}

/// Every page of a set.
async fn get_all(c: &mut Client, name: &str) -> Result<(pb::Set, Vec<pb::SetElement>), CliError> {
    let mut elements = Vec::new();
    let mut token = String::new();
    loop {
        let r = c
            .get_set(pb::GetSetRequest {
                name: name.to_string(),
                page_size: PAGE_SIZE,
                page_token: token.clone(),
            })
            .await?
            .into_inner();
        elements.extend(r.elements);
        match crate::pages::next(&token, r.next_page_token)? {
            Some(t) => token = t,
            None => {
                let set = r
                    .set
                    .ok_or_else(|| CliError::Output("the server sent no set header".into()))?;
                return Ok((set, elements));
            }
        }
    }
}

/// Runs one `vallumctl set` command.
pub async fn run(c: &mut Client, out: Output, cmd: &SetCommand) -> Result<(), CliError> {
    match cmd {
        SetCommand::Create {
            name,
            kind,
            options,
            exist,
        } => {
            let s = c
                .create_set(create_request(name, kind, options, *exist)?)
                .await?
                .into_inner();
            print(out, set_json(&s, None), || {
                format!("created set {} ({} {})\n", s.name, s.r#type, header(&s))
            })?;
        }
        SetCommand::Add {
            name,
            elements: args,
            file,
            exist,
        } => {
            let r = c
                .add_elements(pb::AddElementsRequest {
                    set: name.clone(),
                    elements: elements(args, file.as_deref(), true)?,
                    exist: *exist,
                    ..Default::default()
                })
                .await?
                .into_inner();
            print(
                out,
                json!({"set": name, "added": r.added, "entries": r.entries}),
                || format!("added {} to {name} ({} entries)\n", r.added, r.entries),
            )?;
        }
        SetCommand::Del {
            name,
            elements: args,
            file,
            exist,
        } => {
            let r = c
                .delete_elements(pb::DeleteElementsRequest {
                    set: name.clone(),
                    elements: elements(args, file.as_deref(), false)?,
                    exist: *exist,
                    ..Default::default()
                })
                .await?
                .into_inner();
            print(
                out,
                json!({"set": name, "deleted": r.deleted, "entries": r.entries}),
                || {
                    format!(
                        "deleted {} from {name} ({} entries)\n",
                        r.deleted, r.entries
                    )
                },
            )?;
        }
        SetCommand::List { name, terse } => {
            let names: Vec<String> = match name {
                Some(n) => vec![n.clone()],
                None => all_pages!(
                    |token| c
                        .list_sets(pb::ListSetsRequest {
                            page_size: PAGE_SIZE,
                            page_token: token.clone(),
                        })
                        .await?,
                    sets
                )
                .into_iter()
                .map(|s| s.name)
                .collect(),
            };
            let mut all = Vec::new();
            for n in &names {
                let (set, members) = get_all(c, n).await?;
                all.push((set, (!terse).then_some(members)));
            }
            print(
                out,
                Value::Array(all.iter().map(|(s, m)| set_json(s, m.as_deref())).collect()),
                || {
                    all.iter()
                        .map(|(s, m)| set_text(s, m.as_deref()))
                        .collect::<Vec<_>>()
                        .join("\n")
                },
            )?;
        }
        SetCommand::Show { name } => {
            let (set, members) = get_all(c, name).await?;
            print(out, set_json(&set, Some(&members)), || {
                set_text(&set, Some(&members))
            })?;
        }
        SetCommand::Flush { name } => {
            c.flush_set(pb::FlushSetRequest {
                name: name.clone(),
                ..Default::default()
            })
            .await?;
            print(out, json!({"flushed": name}), || {
                format!("flushed set {name}\n")
            })?;
        }
        SetCommand::Swap { from, to } => {
            c.swap_sets(pb::SwapSetsRequest {
                name: from.clone(),
                other_name: to.clone(),
                ..Default::default()
            })
            .await?;
            print(out, json!({"swapped": [from, to]}), || {
                format!("swapped sets {from} and {to}\n")
            })?;
        }
        SetCommand::Destroy { name } => {
            c.destroy_set(pb::DestroySetRequest {
                name: name.clone(),
                ..Default::default()
            })
            .await?;
            print(out, json!({"destroyed": name}), || {
                format!("destroyed set {name}\n")
            })?;
        }
        SetCommand::Import { file } => {
            let text = read_text(file)?;
            let filename = display_name(file);
            let r = c
                .import_ipset_save(pb::ImportIpsetSaveRequest {
                    text,
                    filename,
                    ..Default::default()
                })
                .await
                .map_err(with_file(file))?
                .into_inner();
            print(out, json!({"lines": r.lines, "sets": r.sets}), || {
                format!(
                    "imported {} lines into {} set(s): {}\n",
                    r.lines,
                    r.sets.len(),
                    r.sets.join(", ")
                )
            })?;
        }
        SetCommand::Save { name } => {
            let r = c
                .export_ipset_save(pb::ExportIpsetSaveRequest {
                    name: name.clone().unwrap_or_default(),
                })
                .await?
                .into_inner();
            match out {
                Output::Json => print(out, json!({"text": r.text}), String::new)?,
                Output::Text => write_stdout(&r.text),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_words_with_timeouts() {
        let e = parse_elements(&["10.0.0.1", "timeout", "60", "10.0.0.2"], true).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].timeout, e[1].timeout), (Some(60), None));
        assert!(parse_elements(&["timeout", "5"], true).is_err());
        assert!(parse_elements(&["10.0.0.1", "timeout", "x"], true).is_err());
        assert!(parse_elements(&["10.0.0.1", "timeout", "5"], false).is_err());
    }

    #[test]
    fn create_options_like_ipset() {
        let o: Vec<String> = [
            "family", "inet6", "timeout", "600", "counters", "maxelem", "10",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let r = create_request("b", "hash:net", &o, false).unwrap();
        assert_eq!(r.family, Family::Ipv6 as i32);
        assert_eq!((r.timeout, r.counters, r.maxelem), (Some(600), true, 10));
        assert!(create_request("b", "hash:net", &["family".into()], false).is_err());
        assert!(create_request("b", "hash:net", &["bogus".into()], false).is_err());
    }
}
