//! The nft text tokenizer: words, quoted strings, punctuation and newlines, each with its 1-based
//! line and column, as nft's own scanner splits `nft -f` input (comments from `#` to the end of
//! the line, `\` + newline joins lines, newlines are tokens because they end statements).
//!
//! A word is a run of characters that are not blanks, quotes or the punctuation
//! `{ } ( ) ; , @ $ # = ! < > & | ^ ~`. Addresses, prefixes, ranges, times and rates stay one
//! word (`10.0.0.0/8`, `fe80::1`, `1024-65535`, `10/second`, `1h30m`); the parser and the
//! datatypes split them. A `:` that ends a word (`80:`) is split off, so map elements may be
//! written `80: accept` as well as `80 : accept`.

use super::{ErrorKind, NftError, Pos};

/// One token of nft text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tok {
    /// A bare word (keyword, name, number, address, ...).
    Word(String),
    /// A `"..."` string, without its quotes (no escapes: nft keeps `\*` as written).
    Str(String),
    /// `$name`: a variable reference.
    Var(String),
    /// One of `{ } ( ) ; , @ = ! < > & | ^ ~` or the two-character `== != <= >=`.
    Punct(&'static str),
    /// The end of a line (statements end here unless inside `{ }` of a set).
    Newline,
}

/// A token and where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    /// What it is.
    pub tok: Tok,
    /// Where its first character is.
    pub pos: Pos,
}

const PUNCT: &[&str] = &[
    "==", "!=", "<=", ">=", "{", "}", "(", ")", ";", ",", "@", "=", "!", "<", ">", "&", "|", "^",
    "~",
];

fn is_word_char(c: char) -> bool {
    !(c.is_whitespace() || "{}();,@$#=!<>&|^~\"".contains(c))
}

/// Splits `text` into tokens. Errors: an unterminated string or a stray character, at its
/// position. Costs one pass over the text.
pub(crate) fn tokenize(file: &str, text: &str) -> Result<Vec<Token>, NftError> {
    let mut out = Vec::new();
    let mut line: u32 = 1;
    let mut line_start = 0usize;
    let bytes = text.as_bytes();
    let mut i = 0usize;
    // (line start, byte, its column): positions are asked for in increasing order, so the
    // column is counted on from the last one (a 10,000-element set on one line stays linear).
    let memo = std::cell::Cell::new((0usize, 0usize, 1u32));
    let pos_at = |line: u32, line_start: usize, i: usize| {
        let (start, at, col) = memo.get();
        let (from, base) = if start == line_start && at <= i {
            (at, col)
        } else {
            (line_start, 1)
        };
        let column = base + text[from..i].chars().count() as u32;
        memo.set((line_start, i, column));
        Pos { line, column }
    };
    while i < bytes.len() {
        let c = text[i..].chars().next().unwrap_or(' ');
        if c == '\n' {
            out.push(Token {
                tok: Tok::Newline,
                pos: pos_at(line, line_start, i),
            });
            i += 1;
            line += 1;
            line_start = i;
            continue;
        }
        if c == '\\' && text[i + 1..].starts_with('\n') {
            i += 2;
            line += 1;
            line_start = i;
            continue;
        }
        if c.is_whitespace() {
            i += c.len_utf8();
            continue;
        }
        let pos = pos_at(line, line_start, i);
        if c == '#' {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == '"' {
            let rest = &text[i + 1..];
            match rest.find(['"', '\n']) {
                Some(end) if rest.as_bytes()[end] == b'"' => {
                    out.push(Token {
                        tok: Tok::Str(rest[..end].to_string()),
                        pos,
                    });
                    i += end + 2;
                    continue;
                }
                _ => {
                    return Err(NftError::new(
                        file,
                        pos,
                        "\"",
                        ErrorKind::UnterminatedString,
                    ));
                }
            }
        }
        if c == '$' {
            let start = i + 1;
            let mut j = start;
            while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || b"_-".contains(&bytes[j]))
            {
                j += 1;
            }
            if j == start {
                return Err(NftError::new(
                    file,
                    pos,
                    "$",
                    ErrorKind::Unexpected("a variable name after `$`"),
                ));
            }
            out.push(Token {
                tok: Tok::Var(text[start..j].to_string()),
                pos,
            });
            i = j;
            continue;
        }
        if let Some(p) = PUNCT.iter().find(|p| text[i..].starts_with(**p)) {
            out.push(Token {
                tok: Tok::Punct(p),
                pos,
            });
            i += p.len();
            continue;
        }
        let start = i;
        while i < bytes.len() {
            let ch = text[i..].chars().next().unwrap_or(' ');
            if !is_word_char(ch) {
                break;
            }
            i += ch.len_utf8();
        }
        let mut word = &text[start..i];
        // `80:` (a map key written against its colon): split the colon off, but keep IPv6
        // addresses ending in `::` whole.
        let split_colon = word.len() > 1 && word.ends_with(':') && !word.ends_with("::");
        if split_colon {
            word = &word[..word.len() - 1];
        }
        // `25:accept` (a map element written without blanks): number, colon, verdict.
        if let Some((k, v)) = word.split_once(':') {
            if !k.is_empty()
                && k.bytes().all(|b| b.is_ascii_digit())
                && !v.is_empty()
                && v.bytes().all(|b| b.is_ascii_lowercase())
            {
                out.push(Token {
                    tok: Tok::Word(k.to_string()),
                    pos,
                });
                out.push(Token {
                    tok: Tok::Word(":".to_string()),
                    pos: pos_at(line, line_start, start + k.len()),
                });
                out.push(Token {
                    tok: Tok::Word(v.to_string()),
                    pos: pos_at(line, line_start, start + k.len() + 1),
                });
                continue;
            }
        }
        out.push(Token {
            tok: Tok::Word(word.to_string()),
            pos,
        });
        if split_colon {
            out.push(Token {
                tok: Tok::Word(":".to_string()),
                pos: pos_at(line, line_start, i - 1),
            });
        }
    }
    out.push(Token {
        tok: Tok::Newline,
        pos: pos_at(line, line_start, bytes.len()),
    });
    Ok(out)
}

impl Tok {
    /// The token as the user wrote it (for error messages).
    pub(crate) fn text(&self) -> String {
        match self {
            Tok::Word(w) => w.clone(),
            Tok::Str(s) => format!("\"{s}\""),
            Tok::Var(v) => format!("${v}"),
            Tok::Punct(p) => (*p).to_string(),
            Tok::Newline => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_strings_and_positions() {
        let t = tokenize(
            "f",
            "table ip t {\n\tip saddr 10.0.0.0/8 iifname \"lo\" # x\n}",
        )
        .unwrap();
        let words: Vec<String> = t.iter().map(|t| t.tok.text()).collect();
        assert_eq!(
            words,
            [
                "table",
                "ip",
                "t",
                "{",
                "",
                "ip",
                "saddr",
                "10.0.0.0/8",
                "iifname",
                "\"lo\"",
                "",
                "}",
                ""
            ]
        );
        assert_eq!(
            t[7].pos,
            Pos {
                line: 2,
                column: 11
            }
        );
        assert!(matches!(
            tokenize("f", "a \"b\nc").unwrap_err().kind,
            ErrorKind::UnterminatedString
        ));
    }

    #[test]
    fn columns_count_characters_on_each_line() {
        // Columns are characters, counted on from the previous token of the line.
        let t = tokenize("f", "comment \"éé\" accept 24:dport\n  drop\n").unwrap();
        let at: Vec<(String, u32, u32)> = t
            .iter()
            .map(|t| (t.tok.text(), t.pos.line, t.pos.column))
            .collect();
        assert_eq!(
            at,
            [
                ("comment".into(), 1, 1),
                ("\"éé\"".into(), 1, 9),
                ("accept".into(), 1, 14),
                ("24".into(), 1, 21),
                (":".into(), 1, 23),
                ("dport".into(), 1, 24),
                ("".into(), 1, 29),
                ("drop".into(), 2, 3),
                ("".into(), 2, 7),
                ("".into(), 3, 1),
            ]
        );
    }
}
