//! Input echoed in messages: at most [`MAX_ECHO_CHARS`] characters of it, control characters
//! escaped.
//!
//! Every message that repeats what a caller sent (a name, a token of a ruleset text, an
//! element) goes through [`quoted`] or [`clipped`], so a message stays short whatever the
//! input (a 10,000-character name echoed whole into `grpc-message` overflowed the client's
//! header limit) and a NUL byte or an escape sequence is shown, not sent to a terminal.
//!
//! - [`quoted`]`(s)` writes what `{s:?}` writes for a short string (`"a\u{0}b"`); a long one
//!   is cut with an ellipsis and followed by its length: `"aaaa…" (10000 bytes)`.
//! - [`clipped`]`(s)` writes the same without quotes, for messages that quote themselves
//!   (`near 'TOKEN'`, iptables' wording).

use std::fmt;

/// The most characters of one input a message repeats.
pub const MAX_ECHO_CHARS: usize = 64;

/// Input as a message shows it (see the module docs); build it with [`quoted`] or
/// [`clipped`].
#[derive(Clone, Copy, Debug)]
pub struct Echo<'a> {
    text: &'a str,
    quote: Option<char>,
}

/// `s` in double quotes, escaped as `{:?}` escapes it, cut after [`MAX_ECHO_CHARS`]
/// characters.
pub fn quoted(s: &str) -> Echo<'_> {
    Echo {
        text: s,
        quote: Some('"'),
    }
}

/// `s` without quotes, control characters escaped, cut after [`MAX_ECHO_CHARS`] characters.
pub fn clipped(s: &str) -> Echo<'_> {
    Echo {
        text: s,
        quote: None,
    }
}

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        if let Some(q) = self.quote {
            f.write_char(q)?;
        }
        let mut chars = self.text.chars();
        for c in chars.by_ref().take(MAX_ECHO_CHARS) {
            let escape = match c {
                '\\' => self.quote.is_some(),
                '"' | '\'' => self.quote == Some(c),
                // Control characters, and what `char::escape_debug` escapes besides them
                // (unprintable and invisible characters such as U+202E).
                _ => c.escape_debug().nth(1).is_some(),
            };
            if escape {
                write!(f, "{}", c.escape_debug())?;
            } else {
                f.write_char(c)?;
            }
        }
        let cut = chars.next().is_some();
        if cut {
            f.write_char('…')?;
        }
        if let Some(q) = self.quote {
            f.write_char(q)?;
        }
        if cut {
            write!(f, " ({} bytes)", self.text.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_shown_as_debug_shows_it() {
        for s in [
            "web",
            "a b",
            "a\0b",
            "tab\there",
            "q\"uote",
            "back\\slash",
            "é",
            "\u{202e}x",
            "",
        ] {
            assert_eq!(quoted(s).to_string(), format!("{s:?}"), "{s:?}");
        }
        assert_eq!(clipped("a\0b\n'c'").to_string(), "a\\0b\\n'c'");
        assert_eq!(clipped("\x1b[31m").to_string(), "\\u{1b}[31m");
    }

    #[test]
    fn long_input_is_cut_with_its_length() {
        let long = "x".repeat(10_000);
        let q = quoted(&long).to_string();
        assert_eq!(
            q,
            format!("\"{}…\" (10000 bytes)", "x".repeat(MAX_ECHO_CHARS))
        );
        let c = clipped(&long).to_string();
        assert_eq!(c, format!("{}… (10000 bytes)", "x".repeat(MAX_ECHO_CHARS)));
        // Exactly the limit: not cut.
        let edge = "y".repeat(MAX_ECHO_CHARS);
        assert_eq!(quoted(&edge).to_string(), format!("{edge:?}"));
        // Cut on a character, not a byte.
        let wide = "é".repeat(100);
        assert!(
            quoted(&wide)
                .to_string()
                .starts_with(&format!("\"{}…\"", "é".repeat(64)))
        );
    }
}
