//! A family's canonical text held as its chunks ([`Text`]): the chunks of the digest tree
//! (cut as `tree.rs` cuts them), each a range of a shared string, with its sha256 computed on
//! first use. A text made from another by a few changed lines ([`Text::splice`]) shares every
//! chunk the change did not reach (its bytes and its digest), cuts and hashes only the chunks
//! around the change, and reads or copies nothing else: an edit of one rule costs a chunk or
//! two whatever the size of the ruleset, and the chunk list's walk (a few dozen bytes per
//! ~64 lines). The text as one string is joined only when someone reads it
//! ([`Text::as_str`]), once.
//!
//! Panics: none on any input; ranges given to [`Text::splice`] that are out of order or off
//! the text are clamped to it (callers pass line boundaries found by [`Text::line_offset`]).

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use sha2::{Digest as _, Sha256};

use super::tree::{ChunkRef, cut_from};

/// One chunk of a [`Text`].
#[derive(Clone, Debug)]
struct Piece {
    /// The string the chunk is a range of (shared with other chunks and other texts).
    src: Arc<String>,
    /// Its range in `src`.
    range: Range<usize>,
    /// Byte offset of its end in the text.
    end: usize,
    /// Newlines in the text up to its end.
    lines: usize,
    /// sha256 of its bytes, once computed.
    digest: OnceLock<[u8; 32]>,
}

impl Piece {
    fn text(&self) -> &str {
        &self.src[self.range.clone()]
    }

    fn start(&self) -> usize {
        self.end - self.range.len()
    }

    fn digest(&self) -> [u8; 32] {
        *self
            .digest
            .get_or_init(|| Sha256::digest(self.text().as_bytes()).into())
    }
}

/// One family's canonical text, as its chunks (see the module docs). Cloning it clones the
/// chunk list (about 90 bytes per chunk), not the text.
#[derive(Clone, Default)]
pub struct Text {
    pieces: Vec<Piece>,
    /// The whole text, once joined (or the string it was made from).
    joined: OnceLock<Arc<String>>,
}

impl Text {
    /// The text `s`, cut into chunks (no copy: the chunks are ranges of `s`; no digest yet).
    pub fn new(s: String) -> Text {
        let src = Arc::new(s);
        let b = src.as_bytes();
        let mut pieces = Vec::with_capacity(b.len() / 2048 + 1);
        let (mut start, mut lines) = (0, 0);
        while start < b.len() {
            let (end, _) = cut_from(b, start);
            lines += newlines(&b[start..end]);
            pieces.push(Piece {
                src: src.clone(),
                range: start..end,
                end,
                lines,
                digest: OnceLock::new(),
            });
            start = end;
        }
        let joined = OnceLock::new();
        let _ = joined.set(src);
        Text { pieces, joined }
    }

    /// The whole text (joined from the chunks on first use, then kept).
    pub fn as_str(&self) -> &str {
        self.joined.get_or_init(|| {
            let mut s = String::with_capacity(self.len());
            for p in &self.pieces {
                s.push_str(p.text());
            }
            Arc::new(s)
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.pieces.last().map_or(0, |p| p.end)
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// How many newlines it has (its lines, when it ends with one).
    pub fn lines(&self) -> usize {
        self.pieces.last().map_or(0, |p| p.lines)
    }

    /// Whether it ends with a newline (or is empty).
    pub fn ends_with_newline(&self) -> bool {
        self.pieces.last().is_none_or(|p| p.text().ends_with('\n'))
    }

    /// Its chunks: where each ends and its sha256 (computed here for those not hashed yet).
    pub fn chunks(&self) -> Vec<ChunkRef> {
        self.pieces
            .iter()
            .map(|p| ChunkRef {
                end: p.end,
                digest: p.digest(),
            })
            .collect()
    }

    /// How many of its chunks are `other`'s own (the same bytes in memory, not copies: tests
    /// check what a splice shares).
    #[cfg(test)]
    pub(crate) fn shared_chunks(&self, other: &Text) -> usize {
        (self.pieces.iter())
            .filter(|p| {
                (other.pieces.iter()).any(|q| Arc::ptr_eq(&p.src, &q.src) && p.range == q.range)
            })
            .count()
    }

    /// How many chunks it has.
    pub fn chunk_count(&self) -> usize {
        self.pieces.len()
    }

    /// The text of chunk `i` (empty past the last).
    pub fn chunk(&self, i: usize) -> &str {
        self.pieces.get(i).map_or("", Piece::text)
    }

    /// The byte offset where line `line` (from 0) starts: after `line` newlines; `None` when
    /// the text has fewer.
    pub fn line_offset(&self, line: usize) -> Option<usize> {
        if line == 0 {
            return Some(0);
        }
        // The first chunk whose end is after the line's newline.
        let k = self.pieces.partition_point(|p| p.lines < line);
        let p = self.pieces.get(k)?;
        let before = k.checked_sub(1).map_or(0, |j| self.pieces[j].lines);
        let n = line - before;
        memchr_nth(p.text().as_bytes(), n).map(|i| p.start() + i + 1)
    }

    /// This text with `changes` made: each replaces the byte range of this text it names with
    /// its string. The ranges are in order and do not overlap, and each starts and ends at a
    /// line start (or the end). The chunks before the first change and after the last (once
    /// the cutting is back on one of this text's cuts) are shared; only the chunks in between
    /// are cut (and hashed when asked). The result is the text (and chunks) that
    /// [`Text::new`] of the changed string gives.
    pub fn splice(&self, changes: &[(Range<usize>, String)]) -> Text {
        let len = self.len();
        let changes: Vec<(Range<usize>, &str)> = changes
            .iter()
            .filter(|(r, t)| !r.is_empty() || !t.is_empty())
            .map(|(r, t)| (r.start.min(len)..r.end.min(len), t.as_str()))
            .collect();
        let Some((first, _)) = changes.first() else {
            return self.clone();
        };
        // The chunk holding the first changed byte (the last chunk for an append at the end):
        // the cutting starts again where it starts.
        let i0 = (self.pieces)
            .partition_point(|p| p.end <= first.start)
            .min(self.pieces.len().saturating_sub(1));
        let from = self.pieces.get(i0).map_or(0, Piece::start);
        let mut buf = String::new();
        let mut at = from;
        for (r, t) in &changes {
            let start = r.start.max(at);
            self.copy_into(&mut buf, at..start);
            buf.push_str(t);
            at = r.end.max(start);
        }
        // The rest of the chunk holding the last change's end.
        let mut next = self.pieces.partition_point(|p| p.end <= at);
        if let Some(p) = self.pieces.get(next) {
            self.copy_into(&mut buf, at..p.end);
            next += 1;
        }
        // Where `buf`'s end is in this text.
        let mut old_end = next.checked_sub(1).map_or(0, |j| self.pieces[j].end);
        // Cut `buf`; when a chunk runs out of it, take the next old chunk too, until a cut
        // falls at the end of `buf` (one of this text's cuts: the rest is shared).
        let mut cuts: Vec<usize> = Vec::new();
        let mut cursor = 0;
        let resynced = loop {
            let (cut, boundary) = cut_from(buf.as_bytes(), cursor);
            if cut < buf.len() || (boundary && cut == buf.len()) {
                cuts.push(cut);
                cursor = cut;
                if cut == buf.len() {
                    break true;
                }
                continue;
            }
            // Ran out of `buf` without a cut.
            match self.pieces.get(next) {
                Some(p) => {
                    buf.push_str(p.text());
                    old_end = p.end;
                    next += 1;
                }
                None => {
                    if cursor < buf.len() {
                        cuts.push(buf.len());
                    }
                    break false;
                }
            }
        };
        let mut pieces: Vec<Piece> = Vec::with_capacity(self.pieces.len() + cuts.len());
        pieces.extend_from_slice(&self.pieces[..i0]);
        let (mut end, mut lines) = pieces.last().map_or((0, 0), |p| (p.end, p.lines));
        let src = Arc::new(buf);
        let mut start = 0;
        for cut in cuts {
            end += cut - start;
            lines += newlines(&src.as_bytes()[start..cut]);
            pieces.push(Piece {
                src: src.clone(),
                range: start..cut,
                end,
                lines,
                digest: OnceLock::new(),
            });
            start = cut;
        }
        if resynced && next < self.pieces.len() {
            let old_lines = self.pieces[next - 1].lines;
            pieces.extend(self.pieces[next..].iter().map(|p| Piece {
                end: p.end - old_end + end,
                lines: p.lines - old_lines + lines,
                ..p.clone()
            }));
        }
        Text {
            pieces,
            joined: OnceLock::new(),
        }
    }

    /// Appends this text's bytes `r` to `out`.
    fn copy_into(&self, out: &mut String, r: Range<usize>) {
        if r.is_empty() {
            return;
        }
        let k = self.pieces.partition_point(|p| p.end <= r.start);
        for p in &self.pieces[k..] {
            let s = p.start();
            if s >= r.end {
                break;
            }
            let a = r.start.max(s) - s;
            let b = r.end.min(p.end) - s;
            out.push_str(&p.text()[a..b]);
        }
    }
}

impl PartialEq for Text {
    /// Texts are cut the same way, so equal texts have equal chunks: compared chunk by chunk,
    /// a chunk both share (a clone, or an untouched chunk of a splice) unread.
    fn eq(&self, other: &Text) -> bool {
        self.len() == other.len()
            && self.pieces.len() == other.pieces.len()
            && self.pieces.iter().zip(&other.pieces).all(|(a, b)| {
                a.end == b.end
                    && ((Arc::ptr_eq(&a.src, &b.src) && a.range == b.range) || a.text() == b.text())
            })
    }
}

impl Eq for Text {}

impl PartialEq<str> for Text {
    /// Compared chunk by chunk against the string's bytes: a spliced text is not joined
    /// (copied whole) to be compared.
    fn eq(&self, other: &str) -> bool {
        let o = other.as_bytes();
        self.len() == o.len()
            && self
                .pieces
                .iter()
                .all(|p| p.text().as_bytes() == &o[p.start()..p.end])
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Newlines in `b`.
fn newlines(b: &[u8]) -> usize {
    b.iter().filter(|c| **c == b'\n').count()
}

/// The index of the `n`-th newline of `b` (from 1).
fn memchr_nth(b: &[u8], n: usize) -> Option<usize> {
    b.iter()
        .enumerate()
        .filter(|(_, c)| **c == b'\n')
        .nth(n.checked_sub(1)?)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::super::tree::Layout;
    use super::super::tree::tests::rules;
    use super::*;

    /// The changes as one string edit.
    fn apply(s: &str, changes: &[(Range<usize>, String)]) -> String {
        let mut out = String::new();
        let mut at = 0;
        for (r, t) in changes {
            out.push_str(&s[at..r.start]);
            out.push_str(t);
            at = r.end;
        }
        out.push_str(&s[at..]);
        out
    }

    /// A splice gives what [`Text::new`] of the edited string gives (text, chunks and their
    /// digests, line count), for insertions, deletions and replacements at the start, the
    /// middle and the end, several at once, a text made empty or from empty, a last line
    /// without a newline, many lines appended; and it shares the untouched chunks.
    #[test]
    fn a_splice_is_the_text_made_again() {
        let base = rules(3000);
        let t = Text::new(base.clone());
        let lines = t.lines();
        let at = |l: usize| t.line_offset(l).unwrap();
        let mut cases: Vec<Vec<(Range<usize>, String)>> = Vec::new();
        for l in [0, 1, 2, 500, 1499, 2000, lines - 2, lines - 1] {
            cases.push(vec![(
                at(l)..at(l),
                format!("-A INPUT -p udp --dport {l} -j DROP\n"),
            )]);
            cases.push(vec![(at(l)..at(l + 1), String::new())]);
            cases.push(vec![(
                at(l)..at(l + 1),
                format!("-A INPUT -p icmp -j ACCEPT -m comment --comment {l}\n"),
            )]);
        }
        cases.push(vec![(at(lines)..at(lines), "-A X\n".into())]);
        cases.push(vec![(at(lines)..at(lines), "-A X".into())]);
        cases.push(vec![(0..base.len(), String::new())]);
        cases.push(vec![(at(10)..at(2900), String::new())]);
        cases.push(vec![
            (at(7)..at(8), "-A INPUT -j DROP\n".into()),
            (at(9)..at(9), "-A INPUT -j LOG\n".into()),
            (at(2900)..at(2910), String::new()),
        ]);
        let mut many = String::new();
        for i in 0..300 {
            many.push_str(&format!(
                "-A INPUT -s 192.168.{}.{} -j DROP\n",
                i / 256,
                i % 256
            ));
        }
        cases.push(vec![(at(lines - 1)..at(lines - 1), many)]);
        for (i, changes) in cases.iter().enumerate() {
            let want = apply(&base, changes);
            let got = t.splice(changes);
            // Compared with a string chunk by chunk (before anything joins it), both ways.
            assert!(got == *want.as_str(), "case {i}");
            if let Some(last) = want.len().checked_sub(1) {
                let mut off = want.clone();
                off.replace_range(last.., "#");
                assert!(!(got == *off.as_str()), "case {i}: one byte off");
            }
            let full = Text::new(want.clone());
            assert_eq!(got.as_str(), want, "case {i}");
            assert_eq!(got.chunks(), full.chunks(), "case {i}");
            assert_eq!(got.lines(), full.lines(), "case {i}");
            assert_eq!(got, full, "case {i}");
            assert_eq!(
                Layout::of(&want, "").v4,
                got.chunks(),
                "case {i}: the chunks of the digest tree"
            );
            // And back, from the spliced text.
            let back = Text::new(want.clone()).splice(&[(0..want.len(), base.clone())]);
            assert_eq!(back, t, "case {i} back");
        }
        // From empty.
        let e = Text::default().splice(&[(0..0, base.clone())]);
        assert_eq!(e, t);
        assert_eq!(e.chunks(), t.chunks());
        // A one-line change makes one or two new chunks; the others are the old ones.
        let one = t.splice(&[(at(1500)..at(1501), "-A INPUT -j DROP\n".into())]);
        let shared = (one.pieces.iter())
            .filter(|p| t.pieces.iter().any(|q| Arc::ptr_eq(&p.src, &q.src)))
            .count();
        assert!(
            one.chunk_count() - shared <= 2,
            "{} chunks, {shared} shared",
            one.chunk_count()
        );
    }

    /// `line_offset` finds every line's start; past the last newline there is none.
    #[test]
    fn line_offsets() {
        let base = rules(700);
        let t = Text::new(base.clone());
        let mut want = vec![0];
        want.extend(base.match_indices('\n').map(|(i, _)| i + 1));
        for (l, w) in want.iter().enumerate() {
            assert_eq!(t.line_offset(l), Some(*w), "line {l}");
        }
        assert_eq!(t.line_offset(want.len()), None);
        assert_eq!(t.lines(), want.len() - 1);
        assert!(t.ends_with_newline());
        assert_eq!(Text::default().line_offset(0), Some(0));
        assert_eq!(Text::default().line_offset(1), None);
    }
}
