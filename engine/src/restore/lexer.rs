//! Splits one iptables-restore line into tokens, as iptables-restore's tokenizer does
//! (xshared.c `add_param_to_argv`).
//!
//! Rules: tokens are separated by spaces and tabs outside double quotes; a `"` opens a quoted part
//! anywhere (even mid-token, as in `--log-prefix="a b"`), and the closing `"` ends the token, so
//! `""` yields an empty token; inside quotes a backslash escapes the next character (the backslash
//! is dropped); single quotes are ordinary characters. Quotes are only grouping: a quoted `"!"`
//! still negates, as in iptables.

use std::borrow::Cow;

/// One token of a line with the 1-based byte column where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token<'a> {
    /// The token text with quotes and escapes removed: a slice of the line unless the token
    /// had a quoted part.
    pub text: Cow<'a, str>,
    /// 1-based byte column of the token's first character (its opening quote when quoted).
    pub column: u32,
}

impl Token<'_> {
    /// A copyable view of the token for the line parser.
    pub(crate) fn tok(&self) -> Tok<'_> {
        Tok {
            text: &self.text,
            column: self.column,
        }
    }
}

/// A token as the line parser reads it: its text (a slice of the line, or of a quoted token's
/// buffer) and the 1-based byte column where it starts. `Copy`, so handing it around costs
/// neither a clone nor an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tok<'t> {
    /// The token text (quotes and escapes removed).
    pub text: &'t str,
    /// 1-based byte column of the token's first character.
    pub column: u32,
}

impl<'t> Tok<'t> {
    /// The text.
    pub(crate) fn as_str(&self) -> &'t str {
        self.text
    }
}

/// A line ended inside a double-quoted part; carries the 1-based column of the opening quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnterminatedQuote {
    /// Column of the `"` that was never closed.
    pub column: u32,
}

/// Byte classes of the tokenizer: ordinary, separator (space, tab, CR, LF), double quote.
const ORDINARY: u8 = 0;
const SPACE: u8 = 1;
const QUOTE: u8 = 2;
const CLASS: [u8; 256] = {
    let mut t = [ORDINARY; 256];
    t[b' ' as usize] = SPACE;
    t[b'\t' as usize] = SPACE;
    t[b'\n' as usize] = SPACE;
    t[b'\r' as usize] = SPACE;
    t[b'"' as usize] = QUOTE;
    t
};

fn class(b: u8) -> u8 {
    CLASS[usize::from(b)]
}

/// Splits `s` at the first `b` (an ASCII byte, so both sides are `str`s): as
/// `str::split_once`, without the general pattern machinery (tokens are a few bytes long).
pub(crate) fn split_byte(s: &str, b: u8) -> Option<(&str, &str)> {
    let i = s.bytes().position(|c| c == b)?;
    Some((&s[..i], &s[i + 1..]))
}

/// Tokenizes one line (without its newline). Tokens without quotes borrow from `line`; only
/// a token with a quoted part allocates. The one tokenizer of iptables words: the parser uses
/// it (through `tokenize_into`), and so does vallumctl to lay out rule text in columns.
pub fn tokenize(line: &str) -> Result<Vec<Token<'_>>, UnterminatedQuote> {
    let mut out = Vec::new();
    tokenize_into(line, &mut out).map(|()| out)
}

/// As [`tokenize`], into `out` (cleared first), so that one buffer serves every line.
pub(crate) fn tokenize_into<'a>(
    line: &'a str,
    out: &mut Vec<Token<'a>>,
) -> Result<(), UnterminatedQuote> {
    out.clear();
    let bytes = line.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if class(b) == SPACE {
            i += 1;
            continue;
        }
        // Separators and quotes are ASCII, so byte positions found here are char boundaries.
        let start = i;
        i += bytes[i..]
            .iter()
            .position(|&b| class(b) != ORDINARY)
            .unwrap_or(bytes.len() - i);
        let column = start as u32 + 1;
        if bytes.get(i).is_none_or(|&b| class(b) != QUOTE) {
            out.push(Token {
                text: Cow::Borrowed(&line[start..i]),
                column,
            });
            continue;
        }
        // A quoted part: everything up to the closing quote, backslash escaping the next
        // character; the closing quote ends the token (even an empty one).
        let quote = i as u32 + 1;
        let mut buf = String::from(&line[start..i]);
        let mut escaped = false;
        let mut closed = None;
        for (j, c) in line[i + 1..].char_indices() {
            if escaped {
                buf.push(c);
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                closed = Some(i + 1 + j + 1);
                break;
            } else {
                buf.push(c);
            }
        }
        let Some(next) = closed else {
            return Err(UnterminatedQuote { column: quote });
        };
        out.push(Token {
            text: Cow::Owned(buf),
            column,
        });
        i = next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &str) -> Vec<String> {
        tokenize(line)
            .expect("test line tokenizes")
            .into_iter()
            .map(|t| t.text.into_owned())
            .collect()
    }

    #[test]
    fn splits_on_spaces_and_tabs() {
        assert_eq!(
            texts("-A  INPUT\t-j ACCEPT"),
            ["-A", "INPUT", "-j", "ACCEPT"]
        );
        assert_eq!(texts("   "), Vec::<String>::new());
    }

    #[test]
    fn double_quotes_group_and_escape() {
        assert_eq!(texts(r#"--comment "a b" x"#), ["--comment", "a b", "x"]);
        assert_eq!(
            texts(r#"--comment "don\'t \"x\"""#),
            ["--comment", r#"don't "x""#]
        );
        assert_eq!(texts(r#"--comment """#), ["--comment", ""]);
        assert_eq!(texts(r#"--log-prefix="a b""#), ["--log-prefix=a b"]);
        // Outside quotes a backslash is an ordinary character.
        assert_eq!(texts(r"a\b"), [r"a\b"]);
    }

    #[test]
    fn single_quotes_are_ordinary() {
        assert_eq!(texts("--log-prefix 'a b'"), ["--log-prefix", "'a", "b'"]);
    }

    #[test]
    fn columns_are_one_based_bytes() {
        let t = tokenize(r#"-A X "q r""#).expect("tokenizes");
        assert_eq!(t.iter().map(|t| t.column).collect::<Vec<_>>(), [1, 4, 6]);
    }

    #[test]
    fn unterminated_quote_reports_its_column() {
        assert_eq!(
            tokenize(r#"-m comment --comment "abc"#),
            Err(UnterminatedQuote { column: 22 })
        );
    }
}
