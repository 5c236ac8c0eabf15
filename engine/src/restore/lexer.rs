//! Splits one iptables-restore line into tokens, as iptables-restore's tokenizer does
//! (xshared.c `add_param_to_argv`).
//!
//! Rules: tokens are separated by spaces and tabs outside double quotes; a `"` opens a quoted part
//! anywhere (even mid-token, as in `--log-prefix="a b"`), and the closing `"` ends the token, so
//! `""` yields an empty token; inside quotes a backslash escapes the next character (the backslash
//! is dropped); single quotes are ordinary characters. Quotes are only grouping: a quoted `"!"`
//! still negates, as in iptables.

/// One token of a line with the 1-based byte column where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    /// The token text with quotes and escapes removed.
    pub text: String,
    /// 1-based byte column of the token's first character (its opening quote when quoted).
    pub column: u32,
}

/// A line ended inside a double-quoted part; carries the 1-based column of the opening quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnterminatedQuote {
    /// Column of the `"` that was never closed.
    pub column: u32,
}

/// Tokenizes one line (without its newline).
pub(crate) fn tokenize(line: &str) -> Result<Vec<Token>, UnterminatedQuote> {
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut start: Option<u32> = None;
    let mut quote_col: Option<u32> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        let col = i as u32 + 1;
        if quote_col.is_some() {
            if escaped {
                buf.push(c);
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                // The closing quote ends the token, even an empty one.
                quote_col = None;
                out.push(Token {
                    text: std::mem::take(&mut buf),
                    column: start.take().unwrap_or(col),
                });
            } else {
                buf.push(c);
            }
            continue;
        }
        match c {
            '"' => {
                quote_col = Some(col);
                start.get_or_insert(col);
            }
            ' ' | '\t' | '\n' | '\r' => {
                if let Some(s) = start.take() {
                    out.push(Token {
                        text: std::mem::take(&mut buf),
                        column: s,
                    });
                }
            }
            _ => {
                start.get_or_insert(col);
                buf.push(c);
            }
        }
    }
    if let Some(column) = quote_col {
        return Err(UnterminatedQuote { column });
    }
    if let Some(s) = start {
        out.push(Token {
            text: buf,
            column: s,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &str) -> Vec<String> {
        tokenize(line)
            .expect("test line tokenizes")
            .into_iter()
            .map(|t| t.text)
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
